"""Hugging Face transformers architectures for the real-model corpus, with random weights.

Every model is built from its config class (nothing comes from a hub). Full variant: 2 layers
at the real width (hidden 768, 12 heads, FFN 3072, 128 tokens); small variant: the same layers
and ops at hidden 32, 2 heads, FFN 64, 16 tokens, vocabulary 128. The full vocabulary is BERT's
30522 for every model: it only sizes the table the embedding gather reads, which no fusion
decision depends on, and the real ones (up to BLOOM's 250880) would make a 770 MB constant.
Attention is HF's ``eager`` implementation: explicit matmul, mask add and softmax, which is
what a fusion pass decides about (``sdpa`` would import as one opaque attention op). The
decoders run as a prefill (an empty KV cache); their ``<name>_decode<past>`` entries are one
generated token against a KV cache of ``past`` tokens (128 and 1024; 8 and 64 in the small
variant), the cache passed as tensors, so that the step is what generation runs per token.

Each builder returns ``(torch module, example args)``; the module is a thin wrapper whose
``forward`` takes the tensors positionally (their parameter names become the Relax input
names) and returns only the main output, ``last_hidden_state``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Dims:
    """Transformer sizes of one variant."""

    hidden: int
    heads: int
    ffn: int
    layers: int
    seq: int
    vocab: int


_FULL = Dims(hidden=768, heads=12, ffn=3072, layers=2, seq=128, vocab=30522)
_SMALL = Dims(hidden=32, heads=2, ffn=64, layers=2, seq=16, vocab=128)


def dims(small: bool) -> Dims:
    return _SMALL if small else _FULL


class _Tokens(nn.Module):
    """``model(input_ids=..., attention_mask=...)`` -> ``last_hidden_state``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class _TokensNoMask(_Tokens):
    """For models whose causal mask is all they use (CLIP's text tower takes a mask too, but
    deployed text encoders feed none)."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).last_hidden_state


class _Pixels(_Tokens):
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).last_hidden_state


class _Audio(_Tokens):
    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        return self.model(input_values=input_values).last_hidden_state


class _CrossDecoder(_Tokens):
    """A seq2seq decoder: target tokens plus the encoder's output states."""

    def forward(self, input_ids: torch.Tensor, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, encoder_hidden_states=encoder_hidden_states)
        return out.last_hidden_state


def _tokens(d: Dims, mask: bool = True) -> tuple[torch.Tensor, ...]:
    ids = torch.randint(0, d.vocab, (1, d.seq), dtype=torch.int64)
    return (ids, torch.ones(1, d.seq, dtype=torch.int64)) if mask else (ids,)


def _encoder(config_name: str, model_name: str, **extra):
    """A BERT-like encoder taking ids and a mask; ``extra`` are config fields."""

    def build(small: bool):
        import transformers

        d = dims(small)
        config = getattr(transformers, config_name)(
            vocab_size=d.vocab, hidden_size=d.hidden, num_hidden_layers=d.layers,
            num_attention_heads=d.heads, intermediate_size=d.ffn,
            max_position_embeddings=max(512, 2 * d.seq), attn_implementation="eager",
            **{k: v(d) if callable(v) else v for k, v in extra.items()})
        return _Tokens(getattr(transformers, model_name)(config)), _tokens(d)

    return build


def _distilbert(small: bool):
    from transformers import DistilBertConfig, DistilBertModel

    d = dims(small)
    config = DistilBertConfig(vocab_size=d.vocab, dim=d.hidden, n_layers=d.layers,
                              n_heads=d.heads, hidden_dim=d.ffn, attn_implementation="eager")
    return _Tokens(DistilBertModel(config)), _tokens(d)


def _gpt2(small: bool):
    from transformers import GPT2Config, GPT2Model

    d = dims(small)
    config = GPT2Config(vocab_size=d.vocab, n_positions=max(2048, d.seq), n_embd=d.hidden,
                        n_layer=d.layers, n_head=d.heads, n_inner=d.ffn, use_cache=True,
                        bos_token_id=1, eos_token_id=2, attn_implementation="eager")
    return _Tokens(GPT2Model(config)), _tokens(d)


class _DecodeStep(nn.Module):
    """One new token against a KV cache given as tensors: ``(input_ids, attention_mask, k0, v0,
    k1, v1, ...)`` -> ``last_hidden_state``. The tensors fill a ``DynamicCache`` inside
    ``forward``, so that ``torch.export`` sees them as inputs and the step concatenates the new
    keys and values onto them as generation does."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                *cache: torch.Tensor) -> torch.Tensor:
        from transformers import DynamicCache

        kv = DynamicCache()
        for layer in range(len(cache) // 2):
            kv.update(cache[2 * layer], cache[2 * layer + 1], layer)
        return self.model(input_ids=input_ids, attention_mask=attention_mask, cache=kv,
                          use_cache=True).last_hidden_state


def _decode_step(prefill: Callable, full_past: int):
    """The decode step of a decoder entry's model, its cache filled by a real prefill of
    ``past`` random tokens (so keys and values have the model's own statistics)."""

    def build(small: bool):
        past = full_past // 16 if small else full_past
        tokens, _ = prefill(small)
        model = tokens.model
        vocab = model.config.vocab_size
        ids = torch.randint(0, vocab, (1, past), dtype=torch.int64)
        with torch.no_grad():
            cache = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                          use_cache=True).past_key_values
        kv = [t.clone() for layer in cache.layers for t in (layer.keys, layer.values)]
        token = torch.randint(0, vocab, (1, 1), dtype=torch.int64)
        return _DecodeStep(model), (token, torch.ones(1, past + 1, dtype=torch.int64), *kv)

    return build


def _decoder(config_name: str, model_name: str, **fields):
    """A decoder-only LM base model; ``fields`` map config names to Dims attributes or values.

    A prefill with the KV cache on, as generation runs it: keys and values are concatenated
    onto the (empty) cache, which is not an output itself."""

    def build(small: bool):
        import transformers

        d = dims(small)
        kw = {k: getattr(d, v) if isinstance(v, str) and hasattr(d, v)
              else v(d) if callable(v) else v for k, v in fields.items()}
        config = getattr(transformers, config_name)(
            vocab_size=d.vocab, use_cache=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            attn_implementation="eager", **kw)
        return _Tokens(getattr(transformers, model_name)(config)), _tokens(d)

    return build


_LAYERS = {"hidden_size": "hidden", "num_hidden_layers": "layers",
           "num_attention_heads": "heads"}


def _bart(part: str):
    def build(small: bool):
        from transformers import BartConfig, BartModel

        d = dims(small)
        config = BartConfig(vocab_size=d.vocab, d_model=d.hidden, encoder_layers=d.layers,
                            decoder_layers=d.layers, encoder_attention_heads=d.heads,
                            decoder_attention_heads=d.heads, encoder_ffn_dim=d.ffn,
                            decoder_ffn_dim=d.ffn, max_position_embeddings=max(1024, d.seq),
                            use_cache=False, attn_implementation="eager")
        model = BartModel(config)
        if part == "encoder":
            return _Tokens(model.get_encoder()), _tokens(d)
        states = torch.randn(1, d.seq, d.hidden)
        return _CrossDecoder(model.get_decoder()), (_tokens(d, mask=False)[0], states)

    return build


def _t5_encoder(small: bool):
    from transformers import T5Config, T5EncoderModel

    d = dims(small)
    config = T5Config(vocab_size=d.vocab, d_model=d.hidden,
                      d_kv=d.hidden // d.heads, d_ff=d.ffn, num_layers=d.layers,
                      num_heads=d.heads, attn_implementation="eager")
    return _Tokens(T5EncoderModel(config)), _tokens(d)


def _clip_text(small: bool):
    from transformers import CLIPTextConfig, CLIPTextModel

    d = dims(small)
    # CLIP's text tower is 512 wide with 8 heads and 77 positions.
    hidden, heads, ffn = (d.hidden, d.heads, d.ffn) if small else (512, 8, 2048)
    config = CLIPTextConfig(vocab_size=d.vocab, hidden_size=hidden,
                            intermediate_size=ffn, num_hidden_layers=d.layers,
                            num_attention_heads=heads, max_position_embeddings=max(77, d.seq),
                            attn_implementation="eager")
    seq = d.seq if small else 77
    ids = torch.randint(0, config.vocab_size, (1, seq), dtype=torch.int64)
    return _TokensNoMask(CLIPTextModel(config)), (ids,)


def _vit(small: bool):
    from transformers import ViTConfig, ViTModel

    d = dims(small)
    px, patch = (32, 8) if small else (224, 16)
    config = ViTConfig(hidden_size=d.hidden, num_hidden_layers=d.layers,
                       num_attention_heads=d.heads, intermediate_size=d.ffn, image_size=px,
                       patch_size=patch, attn_implementation="eager")
    return _Pixels(ViTModel(config, add_pooling_layer=False)), (torch.randn(1, 3, px, px),)


def _segformer(small: bool):
    from transformers import SegformerConfig, SegformerModel

    # Full: MiT-b0 (the config's defaults). Small: the same 4 stages at a quarter of the width.
    kw = {"hidden_sizes": [8, 16, 40, 64], "num_attention_heads": [1, 2, 5, 8]} if small else {}
    config = SegformerConfig(depths=[2, 2, 2, 2], **kw)
    config._attn_implementation = "eager"
    px = 64 if small else 224
    return _Pixels(SegformerModel(config)), (torch.randn(1, 3, px, px),)


def _wav2vec2(small: bool):
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    d = dims(small)
    # Full: wav2vec2-base's feature encoder (7 convs, 512 channels, stride 320) on 1 s of 16 kHz
    # audio; small: 32 channels and 16 frames.
    conv, samples, pos, groups = (32, 5120, 16, 2) if small else (512, 16000, 128, 16)
    config = Wav2Vec2Config(hidden_size=d.hidden, num_hidden_layers=d.layers,
                            num_attention_heads=d.heads, intermediate_size=d.ffn,
                            conv_dim=(conv,) * 7, num_conv_pos_embeddings=pos,
                            num_conv_pos_embedding_groups=groups, attn_implementation="eager")
    return _Audio(Wav2Vec2Model(config)), (torch.randn(1, samples),)


# name -> (family, builder(small) -> (module, args))
MODELS: dict[str, tuple[str, Callable]] = {
    "bert": ("encoder", _encoder("BertConfig", "BertModel")),
    "distilbert": ("encoder", _distilbert),
    "roberta": ("encoder", _encoder("RobertaConfig", "RobertaModel")),
    "albert": ("encoder", _encoder("AlbertConfig", "AlbertModel",
                                   embedding_size=lambda d: d.hidden // 4)),
    "electra": ("encoder", _encoder("ElectraConfig", "ElectraModel",
                                    embedding_size=lambda d: d.hidden // 4)),
    # deberta-v3-base's disentangled attention: c2p and p2c terms, shared keys, LN on the
    # relative embeddings, 256 log-bucketed relative positions (int64 true division, then log).
    "deberta_v2": ("encoder", _encoder(
        "DebertaV2Config", "DebertaV2Model", relative_attention=True, position_buckets=256,
        pos_att_type=["p2c", "c2p"], max_relative_positions=-1, norm_rel_ebd="layer_norm",
        share_att_key=True, position_biased_input=False)),
    "clip_text": ("encoder", _clip_text),
    "gpt2": ("decoder", _gpt2),
    "gpt_neox": ("decoder", _decoder("GPTNeoXConfig", "GPTNeoXModel",
                                     intermediate_size="ffn", **_LAYERS)),
    "opt": ("decoder", _decoder("OPTConfig", "OPTModel", ffn_dim="ffn",
                                word_embed_proj_dim="hidden", **_LAYERS)),
    "bloom": ("decoder", _decoder("BloomConfig", "BloomModel", hidden_size="hidden",
                                  n_layer="layers", n_head="heads")),
    # Falcon-7b's block: multi-query attention (one key/value head, split off with a negative
    # list index, x[..., [-2], :]), rotary positions, attention and MLP in parallel, no biases.
    "falcon": ("decoder", _decoder("FalconConfig", "FalconModel", multi_query=True,
                                   parallel_attn=True, new_decoder_architecture=False,
                                   alibi=False, bias=False, **_LAYERS)),
    "phi": ("decoder", _decoder("PhiConfig", "PhiModel", intermediate_size="ffn",
                                **_LAYERS)),
    "llama": ("decoder", _decoder("LlamaConfig", "LlamaModel", intermediate_size="ffn",
                                  num_key_value_heads="heads", **_LAYERS)),
    # Qwen2's block: grouped-query attention (12 query heads share 2 key/value heads; 2:1 in
    # the small variant), biases on the q/k/v projections only, SwiGLU, RMSNorm, rotary.
    "qwen2": ("decoder", _decoder("Qwen2Config", "Qwen2Model", intermediate_size="ffn",
                                  num_key_value_heads=lambda d: max(1, d.heads // 6),
                                  **_LAYERS)),
    "bart_encoder": ("seq2seq", _bart("encoder")),
    "bart_decoder": ("seq2seq", _bart("decoder")),
    "t5_encoder": ("seq2seq", _t5_encoder),
    "wav2vec2": ("speech", _wav2vec2),
    "vit": ("vision_transformer", _vit),
    "segformer": ("vision_transformer", _segformer),
}
_DECODERS = [name for name, (fam, _) in MODELS.items() if fam == "decoder"]
MODELS.update({f"{name}_decode{past}": ("decode", _decode_step(MODELS[name][1], past))
               for past in (128, 1024) for name in _DECODERS})
