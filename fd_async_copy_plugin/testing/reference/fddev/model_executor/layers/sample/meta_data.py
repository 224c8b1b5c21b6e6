"""Mirrors ``SamplingMetadata`` (develop): the 2.5 replica's (develop adds ``bad_words_token_len``/``token_ids_all``, not modelled)."""

from .....fd25.model_executor.layers.sample.meta_data import SamplingMetadata  # noqa: F401
