"""The replica's bodies where they differ from FastDeploy's, accepted by ``fd_identity`` in test runs.

``LogprobsTensors.slice_rows`` of the replica carries census hooks (helpers only the replica
defines), so its normalised-AST digest is not FastDeploy's. The shipped ``fd_identity`` knows only
FastDeploy's digests; the replica's ``worker/output.py`` adds these to ``fd_identity.ACCEPTED``
when it is imported. Remove an entry once the replica carries FastDeploy's body.
"""

from __future__ import annotations

REPLICA_ONLY: dict[str, dict[str, frozenset[str]]] = {
    "LogprobsTensors.slice_rows": {
        "fastdeploy-2.4": frozenset({"a05466c44e924696e3682637663a34ee6583810aa1ce22967fb6a86bb579b2ab"}),
        "fastdeploy-2.5": frozenset({"b9ff26640ea64d4f1cb23a324ff8c4063d22a88cb4bcc4c3a2e36e2225608c06"}),
        # the develop replica carries the 2.5 replica's body (as develop carries 2.5's)
        "fastdeploy-2.6+": frozenset({"b9ff26640ea64d4f1cb23a324ff8c4063d22a88cb4bcc4c3a2e36e2225608c06"}),
    },
}


def register() -> None:
    """Accept the digests of ``REPLICA_ONLY`` like ``fd_identity.KNOWN``'s."""
    from fd_async_copy_plugin import fd_identity

    for name, profiles in REPLICA_ONLY.items():
        known = fd_identity.ACCEPTED.setdefault(name, {})
        for profile, digests in profiles.items():
            known[profile] = known.get(profile, frozenset()) | frozenset(digests)
