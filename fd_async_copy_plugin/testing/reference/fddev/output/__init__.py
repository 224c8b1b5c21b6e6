"""Package of the FastDeploy develop replica (mirrors the ``fastdeploy`` package of the same path)."""
