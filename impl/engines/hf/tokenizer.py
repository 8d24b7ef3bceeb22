"""The tokenizer part of a loaded model's :class:`~unsee.impl.engines.protocol.ModelInfo`,
written once for every engine whose tokenizer is ours (the byte tokenizer or a
transformers tokenizer): the transformers engine's :class:`~unsee.impl.engines.hf.models.LoadedModel`
and the vLLM engine's :class:`~unsee.impl.engines.vllm.models.VllmModel` (vLLM runs
with ``skip_tokenizer_init``: prompts go in as token ids)."""

from __future__ import annotations

from collections.abc import Sequence

from unsee.impl.engines.files import ByteTokenizer
from unsee.impl.engines.hf import adapter


class TokenizerMethods:
    """``encode``, ``decode``, ``chat_template`` and ``special_tokens`` over
    ``self.tokenizer`` (a :class:`ByteTokenizer` or a transformers tokenizer),
    for a class that has that attribute (a mixin: it adds no fields)."""

    def encode(self, text: str) -> list[int]:
        """Token ids for ``text``, without BOS; chat markers map to single ids."""
        if isinstance(self.tokenizer, ByteTokenizer):
            return self.tokenizer.encode(text)
        return adapter.hf_encode(self.tokenizer, text)

    def decode(self, ids: Sequence[int]) -> str:
        if isinstance(self.tokenizer, ByteTokenizer):
            return self.tokenizer.decode(ids)
        return adapter.hf_decode(self.tokenizer, ids)

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's chat template (None for the byte tokenizer: ChatML)."""
        if isinstance(self.tokenizer, ByteTokenizer):
            return None
        return adapter.chat_template_of(self.tokenizer)

    @property
    def special_tokens(self) -> dict[str, str]:
        """The special tokens' texts a chat template names."""
        if isinstance(self.tokenizer, ByteTokenizer):
            return {}
        return adapter.special_tokens_of(self.tokenizer)


__all__ = ["TokenizerMethods"]
