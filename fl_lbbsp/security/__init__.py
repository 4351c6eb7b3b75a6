"""What the server does not trust: the defence layer above the core, composed onto the
round engine by :mod:`.guard` (by default in the strategies).

- :mod:`.identity` and :mod:`.silo_keys`: Ed25519 signing keys, the registry of silos, the
  signature each reply carries (signatures prove origin, not validity);
- :mod:`.claims`: a silo's claims (dataset size, times) bounded by what the federation shows;
- :mod:`.screening` and :mod:`.reply_screen`: a reply's contract, size and arrays checked;
- :mod:`.update_screen`: plaintext updates and dataset-size weights bounded against the rest.
"""
