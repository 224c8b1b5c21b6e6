"""Package of the FastDeploy 2.5 replica (mirrors the ``fastdeploy`` package of the same path)."""
