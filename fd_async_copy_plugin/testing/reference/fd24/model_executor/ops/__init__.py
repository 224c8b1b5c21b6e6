"""Package of the FastDeploy 2.4 replica (mirrors the ``fastdeploy`` package of the same path)."""
