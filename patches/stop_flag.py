"""Features ``stop_flag`` and ``sampled_tokens``: backport of FastDeploy PR #6176 to FastDeploy 2.4.

(Implementation in progress: declared here so the registry, doctor and status report them.)
"""

from __future__ import annotations

from fd_async_copy_plugin.registry.patch import Feature


class StopFlagFeature(Feature):
    name = "stop_flag"
    mirrors = "FastDeploy PR #6176 (device-side not_need_stop, get_stop/set_stop, event-synced save)"
    profiles = {
        "fastdeploy-2.5": "native: FastDeploy 2.5 has PR #6176",
        "fastdeploy-2.6+": "native: FastDeploy 2.6+ has PR #6176 and #6356",
    }
    needs_ops = True

    def patches(self, ctx):
        return []


class SampledTokensFeature(Feature):
    name = "sampled_tokens"
    mirrors = "FastDeploy PR #6176 (pinned sampled_token_ids, event-synced save)"
    profiles = dict(StopFlagFeature.profiles)

    def patches(self, ctx):
        return []


FEATURES = [StopFlagFeature(), SampledTokensFeature()]
