"""A local Flower deployment (``fl-lbbsp deploy-local``): a SuperLink and one SuperNode per
silo on 127.0.0.1 (:mod:`.federation`), its TLS material (:mod:`.tls`), processes
and their supervision (:mod:`.processes`), silos (:mod:`.silos`), Flower's
programs and files (:mod:`.flower_cli`), and apps run on it (:mod:`.app_run`)."""

from ...clients.emulation import slowdowns_from_speeds
from .app_run import RunOutcome, describe, exit_code_for, run_app, run_status, serve
from .federation import AUTO_SILO_KEYS, CONNECTION, LocalFederation
from .flower_cli import app_declares, read_run_config, write_run_config
from .processes import ManagedProcess, RestartPolicy, free_port, stop_processes
from .silos import SiloNode
from .tls import NodeKeys, TlsFiles, generate_node_keys, generate_tls

__all__ = [
    "AUTO_SILO_KEYS", "CONNECTION", "LocalFederation", "ManagedProcess", "NodeKeys",
    "RestartPolicy", "RunOutcome", "SiloNode", "TlsFiles", "app_declares", "describe",
    "exit_code_for", "free_port", "generate_node_keys", "generate_tls", "read_run_config",
    "run_app", "run_status", "serve", "slowdowns_from_speeds", "stop_processes",
    "write_run_config",
]  # fmt: skip
