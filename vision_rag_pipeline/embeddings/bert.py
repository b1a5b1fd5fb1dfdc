"""A BERT sentence encoder in plain torch, for the models most sentence-transformers users run.

Importing sentence-transformers (and the transformers and scikit-learn it pulls in) takes ~4 s
before a single text is encoded; torch and the `tokenizers` library alone take ~1.2 s. A one-file
ingest spent more than half its wall time on that import, so a model directory of the common shape
(a BERT `Transformer`, mean or CLS `Pooling`, an optional `Normalize`) is run here with the same
weights, tokenizer and operations; any other model goes through sentence-transformers
(`encoder._load`). A test holds the two to the same vectors.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"


@dataclass(frozen=True)
class BertLayout:
    """What a model directory says about its BERT and its pooling."""

    directory: Path
    config: dict
    pooling: str  # "mean" or "cls"
    normalize: bool
    max_seq_length: int


def bert_layout(directory: Path) -> BertLayout | None:
    """The directory's layout when it is a BERT sentence model this module runs, else None."""
    try:
        modules = json.loads((directory / "modules.json").read_text(encoding="utf-8"))
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        sentence_config = json.loads((directory / "sentence_bert_config.json").read_text(encoding="utf-8"))
        pooling_dir = next(m["path"] for m in modules if m["type"] == _POOLING)
        pooling_config = json.loads((directory / pooling_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, StopIteration):
        return None
    types = [m.get("type") for m in modules]
    if types not in ([_TRANSFORMER, _POOLING], [_TRANSFORMER, _POOLING, _NORMALIZE]):
        return None
    if modules[0].get("path") or config.get("model_type") != "bert":
        return None
    if config.get("position_embedding_type", "absolute") != "absolute" or config.get("hidden_act") != "gelu":
        return None
    if not (directory / "model.safetensors").is_file() or not (directory / "tokenizer.json").is_file():
        return None
    modes = {key for key, on in pooling_config.items() if key.startswith("pooling_mode_") and on}
    pooling = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}.get(next(iter(modes), ""))
    if len(modes) != 1 or pooling is None:
        return None
    limit = sentence_config.get("max_seq_length") or config.get("max_position_embeddings", 512)
    limit = min(int(limit), int(config.get("max_position_embeddings", 512)))
    return BertLayout(directory, config, pooling, normalize=_NORMALIZE in types, max_seq_length=limit)


def quantized_linears(weights: dict, names: list[str]) -> dict:
    """{Linear layer name: its int8 packed weights}, as `torch.ao.quantization.quantize_dynamic` with
    `per_channel_dynamic_qconfig` packs an `nn.Linear`: symmetric int8 weights with one scale per
    output row (per-tensor scales moved MiniLM's vectors too far, median cosine 0.91 to float32),
    bias kept in float32. Activations are quantized per batch when the layer runs."""
    import torch

    packed = {}
    # torch 2.13 announces that quantized tensors will move to torchao; they are what its int8
    # kernels take today, and a run's log is no place for the notice
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        from torch.ao.quantization.observer import PerChannelMinMaxObserver

        for name in names:
            weight = weights[f"{name}.weight"].float()
            observer = PerChannelMinMaxObserver(
                ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric
            )
            observer(weight)
            scales, zero_points = observer.calculate_qparams()
            qweight = torch.quantize_per_channel(
                weight, scales.to(torch.double), zero_points.to(torch.int64), 0, torch.qint8
            )
            packed[name] = torch.ops.quantized.linear_prepack(qweight, weights[f"{name}.bias"].float())
    return packed


_LINEAR_SUFFIXES = (
    ".attention.self.query.weight",
    ".attention.self.key.weight",
    ".attention.self.value.weight",
    ".attention.output.dense.weight",
    ".intermediate.dense.weight",
    ".output.dense.weight",
)


def _is_linear(name: str) -> bool:
    """An encoder layer's Linear weight (the pooler and embeddings are not run or not Linear)."""
    return name.startswith("encoder.layer.") and name.endswith(_LINEAR_SUFFIXES)


class BertSentenceEncoder:
    """Token ids -> pooled sentence vectors, computed as `BertModel` + `Pooling` compute them.

    `dtype` torch.float32 or torch.bfloat16 runs every layer in it; `int8=True` runs the Linear layers
    on int8 weights (`quantized_linears`) and the rest (embeddings, attention, layer norms) in float32,
    what quantize_dynamic makes of a sentence-transformers model.
    """

    def __init__(self, layout: BertLayout, dtype, int8: bool = False) -> None:  # dtype: torch.dtype
        import torch
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        self.layout = layout
        self.max_seq_length = layout.max_seq_length
        self.tokenizer = Tokenizer.from_file(str(layout.directory / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_seq_length)
        weights = load_file(str(layout.directory / "model.safetensors"))
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in weights else ""
        self._weights = {
            name[len(prefix) :]: tensor.to(dtype)
            for name, tensor in weights.items()
            if name.startswith(prefix) and tensor.is_floating_point()
        }
        config = layout.config
        self.dimension = int(config["hidden_size"])
        self._heads = int(config["num_attention_heads"])
        self._layers = int(config["num_hidden_layers"])
        self._eps = float(config.get("layer_norm_eps", 1e-12))
        self._torch = torch
        linears = sorted({name[: -len(".weight")] for name in self._weights if _is_linear(name)})
        self._int8 = quantized_linears(self._weights, linears) if int8 else {}
        for name in self._int8:  # the float weights are not used again
            del self._weights[f"{name}.weight"]

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self.tokenizer.encode_batch(texts)]

    def encode(self, token_ids: list[list[int]]):  # -> torch.Tensor, one row per text
        torch = self._torch
        functional = torch.nn.functional
        w = self._weights
        longest = max(len(ids) for ids in token_ids)
        ids = torch.zeros((len(token_ids), longest), dtype=torch.long)
        mask = torch.zeros((len(token_ids), longest), dtype=torch.bool)
        for row, row_ids in enumerate(token_ids):
            ids[row, : len(row_ids)] = torch.tensor(row_ids)
            mask[row, : len(row_ids)] = True
        hidden_size = self.dimension
        head_size = hidden_size // self._heads

        def linear(x, name):
            packed = self._int8.get(name)
            if packed is not None:  # reduce_range as nn.quantized.dynamic.Linear (7-bit activations)
                return torch.ops.quantized.linear_dynamic(x, packed, reduce_range=True)
            return functional.linear(x, w[f"{name}.weight"], w[f"{name}.bias"])

        def norm(x, name):
            return functional.layer_norm(x, (hidden_size,), w[f"{name}.weight"], w[f"{name}.bias"], self._eps)

        def heads(x):
            return x.view(x.shape[0], x.shape[1], self._heads, head_size).transpose(1, 2)

        with torch.inference_mode():
            x = (
                w["embeddings.word_embeddings.weight"][ids]
                + w["embeddings.token_type_embeddings.weight"][0]
                + w["embeddings.position_embeddings.weight"][:longest]
            )
            x = norm(x, "embeddings.LayerNorm")
            attend = None if bool(mask.all()) else mask[:, None, None, :].expand(-1, 1, longest, -1)
            for layer in range(self._layers):
                at = f"encoder.layer.{layer}"
                context = functional.scaled_dot_product_attention(
                    heads(linear(x, f"{at}.attention.self.query")),
                    heads(linear(x, f"{at}.attention.self.key")),
                    heads(linear(x, f"{at}.attention.self.value")),
                    attn_mask=attend,
                    scale=head_size**-0.5,
                )
                context = context.transpose(1, 2).reshape(x.shape)
                x = norm(
                    linear(context, f"{at}.attention.output.dense") + x, f"{at}.attention.output.LayerNorm"
                )
                inner = functional.gelu(linear(x, f"{at}.intermediate.dense"))
                x = norm(linear(inner, f"{at}.output.dense") + x, f"{at}.output.LayerNorm")
            if self.layout.pooling == "cls":
                pooled = x[:, 0]
            else:
                weights = mask.unsqueeze(-1).to(x.dtype)  # summed in float32, as sentence-transformers does
                total = (x * weights).sum(1, dtype=torch.float32)
                pooled = (total / weights.sum(1, dtype=torch.float32).clamp(min=1e-9)).to(x.dtype)
            # in the model's precision, as the Normalize module does: the vectors stay those of sentence-transformers
            return functional.normalize(pooled, dim=1) if self.layout.normalize else pooled
