"""``fl-lbbsp keys generate`` and ``--encrypt``: key files, and user errors exit 2."""

from __future__ import annotations

import pytest

pytest.importorskip("tenseal")

from fl_lbbsp.cli import main  # noqa: E402
from fl_lbbsp.crypto import load_server_keys, load_silo_keys  # noqa: E402


def test_keys_generate_writes_silo_and_server_files_with_one_fingerprint(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    # Execute
    code = main(["keys", "generate", "--out", str(tmp_path), "--poly-modulus-degree", "4096"])

    # Assert
    out = capsys.readouterr().out
    server = load_server_keys(tmp_path / "public.ckks")
    silo = load_silo_keys(tmp_path / "secret.ckks")
    assert code == 0
    assert server.fingerprint == silo.fingerprint
    assert (tmp_path / "fingerprint.txt").read_text().strip() == server.fingerprint
    assert server.fingerprint in out
    assert server.config.poly_modulus_degree == 4096


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["keys", "generate", "--poly-modulus-degree", "5000"], "--poly-modulus-degree"),
        (["keys", "generate", "--coeff-mod-bit-sizes", "40,40"], "too short"),
        (["keys", "generate", "--coeff-mod-bit-sizes", "60,x"], "--coeff-mod-bit-sizes"),
        (["simulate", "--encrypt", "/no/such/keys"], "--encrypt"),
        (["cluster", "--schemes", "lbbsp", "--encrypt", "/no/such/keys"], "--encrypt"),
        (["cluster", "--schemes", "lbbsp-naive", "--encrypt", "/no/keys"], "not supported"),
    ],
)
def test_key_errors_exit_2_with_a_message(
    argv: list[str], message: str, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    # Execute
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--out", str(tmp_path / "out")])

    # Assert
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert message in err
    assert "Traceback" not in err


def test_existing_keys_are_not_replaced_without_force(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    main(["keys", "generate", "--out", str(tmp_path), "--poly-modulus-degree", "4096"])
    before = (tmp_path / "secret.ckks").read_bytes()

    # Execute
    with pytest.raises(SystemExit) as exit_info:
        main(["keys", "generate", "--out", str(tmp_path), "--poly-modulus-degree", "4096"])
    forced = main(
        ["keys", "generate", "--out", str(tmp_path), "--poly-modulus-degree", "4096", "--force"]
    )

    # Assert
    assert exit_info.value.code == 2 and "--force" in capsys.readouterr().err
    assert forced == 0 and (tmp_path / "secret.ckks").read_bytes() != before


@pytest.mark.parametrize("mode", [0o644, 0o660])
def test_a_secret_context_readable_by_others_is_refused_with_the_fix(
    mode: int, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: keys whose secret context others may read
    main(["keys", "generate", "--out", str(tmp_path / "k"), "--poly-modulus-degree", "4096"])
    secret = tmp_path / "k" / "secret.ckks"
    secret.chmod(mode)
    capsys.readouterr()

    # Execute
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--silos", "3", "--model", "mlp", "--encrypt", str(tmp_path / "k"),
              "--out", str(tmp_path / "out")])  # fmt: skip

    # Assert: one line with the mode and the chmod fix; the public context may stay 0644
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert f"{mode:04o}" in err and f"chmod 600 {secret}" in err and "Traceback" not in err
    assert (tmp_path / "k" / "public.ckks").stat().st_mode & 0o777 == 0o644
