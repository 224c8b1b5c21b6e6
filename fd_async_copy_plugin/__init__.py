"""fd-async-copy-plugin: asynchronous GPU->host output copies for PaddlePaddle FastDeploy.

Public API (kept stable; FastDeploy users and FastDeploy itself see these names):

- ``register()`` - the ``fastdeploy.model_register_plugins`` entry point ``fd_async_copy``.
- ``enable(features=None, backend="auto", strict=False)``, ``disable()``, ``status()``.
"""

__version__ = "0.1.0"
