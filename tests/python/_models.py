"""The small models, data and losses that the PyTorch executor's and the DeepSpeed
engine's tests train, each against a single-process reference of its own:

* ``clip_layers()``: tiny-clip's two towers, 2 layers each, their embeddings normalised;
* ``mllm_layers()``: tiny-mllm-4px's vision, projector and llm, 2 layers each;
* ``dataset(kind, size, seed)``: a "clip" or "mllm" batch of ``size`` samples;
* ``caption_loss`` (the llm's per-sample loss) and ``clip_loss`` (CLIP's symmetric
  cross-entropy at ``LOGIT_SCALE``).

Every layer seeds its own weights, so every process builds the same model. Also
PyTorch for the tests of braid.torch: ``torch``, ``dist``, ``mp`` (None without it) and
``TORCH_REASON`` (why they skip, "" when PyTorch is there). Without PyTorch this imports,
and defines nothing that needs it.
"""

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
    TORCH_REASON = ""
except ImportError as e:  # pragma: no cover - depends on the machine
    torch = dist = mp = F = None
    TORCH_REASON = f"PyTorch is not importable ({e}); install python3-torch"

IMAGE_PATCHES, PATCH, HIDDEN, TOKENS, VOCAB = 4, 6, 8, 3, 5
LOGIT_SCALE = 3.0
Module = torch.nn.Module if torch else object


class Dense(Module):
    """Linear (+ GELU) with its own seed, so every process builds the same weights. A
    module's first layer reads its input from the microbatch (``source``) when it starts
    the model."""

    def __init__(self, seed, d_in, d_out, gelu=True, source=None, normalize=False):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = torch.nn.Linear(d_in, d_out)
        self.gelu, self.source, self.normalize = gelu, source, normalize

    def forward(self, x, batch=None):
        if self.source is not None and x is None:
            x = batch[self.source]
        y = self.linear(x)
        y = F.gelu(y) if self.gelu else y
        return F.normalize(y, dim=-1) if self.normalize else y


class LlmInput(Module):
    """The llm's first layer: the projected image tokens, then the caption's embeddings."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.linear = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, image_tokens, batch):
        return F.gelu(self.linear(torch.cat([image_tokens, self.embed(batch["text"])], dim=1)))


def clip_layers():
    """tiny-clip's towers, 2 layers each (configs/models/tiny-clip.yaml)."""
    return {
        "image_encoder": [Dense(11, PATCH, HIDDEN, source="image"), Dense(12, HIDDEN, HIDDEN, False, normalize=True)],
        "text_encoder": [Dense(21, PATCH, HIDDEN, source="text"), Dense(22, HIDDEN, HIDDEN, False, normalize=True)],
    }


def mllm_layers(projector_source=None):
    """tiny-mllm-4px's vision, projector and llm, 2 layers each (configs/models/tiny-mllm-4px.yaml);
    ``projector_source``: the projector's first layer's ``source``."""
    return {
        "vision": [Dense(31, PATCH, HIDDEN, source="image"), Dense(32, HIDDEN, HIDDEN)],
        "projector": [Dense(41, HIDDEN, HIDDEN, source=projector_source), Dense(42, HIDDEN, HIDDEN, False)],
        "llm": [LlmInput(51), Dense(52, HIDDEN, VOCAB, False)],
    }


def dataset(kind, size, seed):
    """``size`` samples: "clip" image and text features, or "mllm" image patches and caption tokens."""
    g = torch.Generator().manual_seed(seed)
    if kind == "clip":
        return {"image": torch.randn(size, PATCH, generator=g), "text": torch.randn(size, PATCH, generator=g)}
    return {"image": torch.randn(size, IMAGE_PATCHES, PATCH, generator=g),
            "text": torch.randint(0, VOCAB, (size, TOKENS), generator=g)}


def caption_loss(logits, batch):
    """Per-sample loss: the caption tokens' mean cross-entropy, each predicted from the token before."""
    text_logits = logits[:, IMAGE_PATCHES - 1:-1, :]
    ce = F.cross_entropy(text_logits.reshape(-1, VOCAB), batch["text"].reshape(-1), reduction="none")
    return ce.view(batch["text"].shape).mean(dim=1)


def clip_loss(image, text):
    logits = LOGIT_SCALE * image @ text.t()
    labels = torch.arange(logits.shape[0])
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
