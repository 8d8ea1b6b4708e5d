"""The PyTorch peer of bench/train_bench.cpp: one training step of a reference model in torch.nn.

train_bench writes to DIR:
  spec.json    the model's modules (shapes from the model file), the batch, the step counts,
               AdamW's settings and braid's parameter list (name, shape) in braid's order;
  params.bin   braid's initial parameter values (float32, that order, each row-major);
  images.bin   the images (float32, B x C x H x W; empty for a language model alone);
  tokens.bin   the token ids (int32, B x T; every caption T tokens long).
This script builds the same architecture as braid's reference modules (core/nn/modules), with
parameter names equal to braid's, checks that both have the same parameters with the same
element counts, loads braid's values, and times training steps as train_bench times braid's:
  zero grads, forward, backward, AdamW on every parameter (weight decay on matrices only),
  and, for CLIP, open_clip's clamp of the temperature.
It runs on --device (cpu, or cuda with TF32 off unless --tf32, as braid's CUDA backend), eager or with
--compile under torch.compile, and prints one line:
  peer params=<count> first_loss=<loss of the first step> second_loss=<of the second>
       median_step_s=<s> torch=<version> threads=<T> device=<device>[ compiled]
"""

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

LAYER_NORM_EPS = 1e-5  # braid's kLayerNormEps
MAX_LOGIT_SCALE_PARAM = math.log(100.0)  # braid's kMaxLogitScaleParam, open_clip's cap


class Attention(nn.Module):
    """Separate q, k, v projections with bias, softmax(q k^T / sqrt(D)) v per head, output projection."""

    def __init__(self, hidden, heads, causal):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, e = x.shape
        d = e // self.heads

        def split(t):
            return t.view(b, s, self.heads, d).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        if self.causal:
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        attn = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, s, e)
        return self.out(attn)


class Mlp(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)
        self.act = nn.GELU(approximate="tanh")  # braid's Ops::gelu_forward is the tanh form

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-LN: x2 = x + attn(ln1(x)); y = x2 + mlp(ln2(x2))."""

    def __init__(self, m):
        super().__init__()
        self.ln1 = nn.LayerNorm(m["hidden"], eps=LAYER_NORM_EPS)
        self.attn = Attention(m["hidden"], m["heads"], m["causal"])
        self.ln2 = nn.LayerNorm(m["hidden"], eps=LAYER_NORM_EPS)
        self.mlp = Mlp(m["hidden"], m["ffn"])

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """`layers` blocks then the final norm; the owner holds the embeddings."""

    def __init__(self, m):
        super().__init__()
        self.blocks = nn.ModuleList(Block(m) for _ in range(m["layers"]))
        self.final_norm = nn.LayerNorm(m["hidden"], eps=LAYER_NORM_EPS)

    def run(self, x):
        for block in self.blocks:
            x = block(x)
        return self.final_norm(x)


class PositionGrid(nn.Module):
    """Factorised position tables: patch (r, c) gets rows[r] + cols[c]."""

    def __init__(self, grid, hidden):
        super().__init__()
        self.rows = nn.Parameter(torch.zeros(grid, hidden))
        self.cols = nn.Parameter(torch.zeros(grid, hidden))

    def forward(self, rows, cols):
        return (self.rows[:rows].unsqueeze(1) + self.cols[:cols].unsqueeze(0)).reshape(rows * cols, -1)


class ImageEncoder(Transformer):
    """ViT: stride-P convolution, factorised positions, blocks, final norm; pooled = mean of the tokens."""

    def __init__(self, m):
        super().__init__(m)
        p = m["patch_size"]
        self.patch_embed = nn.Conv2d(m["channels"], m["hidden"], p, stride=p)
        self.pos_embed = PositionGrid(m["max_image_size"] // p, m["hidden"])

    def forward(self, images):
        x = self.patch_embed(images)  # (B, E, H/P, W/P)
        rows, cols = x.shape[2], x.shape[3]
        x = x.flatten(2).transpose(1, 2) + self.pos_embed(rows, cols)  # (B, N, E), row-major patches
        tokens = self.run(x)
        return tokens, tokens.mean(dim=1)


class TextEncoder(Transformer):
    """Token + position tables, blocks, final norm; pooled at each sample's last token."""

    def __init__(self, m):
        super().__init__(m)
        self.token_embed = nn.Parameter(torch.zeros(m["vocab"], m["hidden"]))
        self.pos_embed = nn.Parameter(torch.zeros(m["max_positions"], m["hidden"]))

    def forward(self, ids, lengths):
        t = ids.shape[1]
        tokens = self.run(self.token_embed[ids] + self.pos_embed[:t])
        return tokens, tokens[torch.arange(ids.shape[0], device=ids.device), lengths - 1]


class ContrastiveLoss(nn.Module):
    """CLIP's symmetric InfoNCE with logit scale exp(min(t, ln 100))."""

    def __init__(self):
        super().__init__()
        self.logit_scale = nn.Parameter(torch.zeros(1))

    def forward(self, image, text):
        logits = self.logit_scale.clamp(max=MAX_LOGIT_SCALE_PARAM).exp() * image @ text.T
        labels = torch.arange(image.shape[0], device=image.device)
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


class Clip(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.names = {}
        for m in spec["modules"]:
            if m["role"] == "loss":
                self.names["loss"] = m["name"]
                self.add_module(m["name"], ContrastiveLoss())
                continue
            tower = ImageEncoder(m) if m["modality"] == "image" else TextEncoder(m)
            tower.proj = nn.Linear(m["hidden"], m["embed_dim"], bias=False)  # braid's ClipHead "<name>.proj"
            self.names[m["modality"]] = m["name"]
            self.add_module(m["name"], tower)

    def part(self, key):
        return getattr(self, self.names[key])

    def forward(self, images, ids, lengths):
        image_encoder, text_encoder = self.part("image"), self.part("text")
        _, image_pooled = image_encoder(images)
        _, text_pooled = text_encoder(ids, lengths)
        image = F.normalize(image_encoder.proj(image_pooled), dim=-1)
        text = F.normalize(text_encoder.proj(text_pooled), dim=-1)
        return self.part("loss")(image, text)

    def after_step(self):
        with torch.no_grad():  # open_clip: t = clamp(t, 0, ln 100) after each optimizer step
            self.part("loss").logit_scale.clamp_(0, MAX_LOGIT_SCALE_PARAM)


class Projector(nn.Module):
    """`layers` linear layers, GELU (tanh) between them."""

    def __init__(self, m, width_in):
        super().__init__()
        widths = [width_in] + [m["ffn"]] * (m["layers"] - 1) + [m["hidden"]]
        self.layers = nn.ModuleList(nn.Linear(widths[i], widths[i + 1]) for i in range(m["layers"]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            if i > 0:
                x = F.gelu(x, approximate="tanh")
            x = layer(x)
        return x


class Decoder(Transformer):
    """[prefix ; text tokens] + positions, causal blocks, final norm, LM head over the text positions."""

    def __init__(self, m):
        super().__init__(m)
        self.token_embed = nn.Parameter(torch.zeros(m["vocab"], m["hidden"]))
        self.pos_embed = nn.Parameter(torch.zeros(m["max_positions"], m["hidden"]))
        self.lm_head = nn.Linear(m["hidden"], m["vocab"], bias=False)

    def forward(self, prefix, ids):
        x = torch.cat([prefix, self.token_embed[ids]], dim=1)
        h = self.run(x + self.pos_embed[: x.shape[1]])
        return self.lm_head(h[:, prefix.shape[1] :])


class Mllm(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.names = {}
        hidden = {}
        for m in spec["modules"]:
            if m["role"] == "encoder":
                part = ImageEncoder(m)
            elif m["role"] == "projector":
                part = Projector(m, hidden[m["inputs"][0]])
            else:
                part = Decoder(m)
            hidden[m["name"]] = m["hidden"]
            self.names[m["role"]] = m["name"]
            self.add_module(m["name"], part)

    def part(self, key):
        return getattr(self, self.names[key])

    def forward(self, images, ids, lengths):
        if "encoder" in self.names:
            prefix, _ = self.part("encoder")(images)
            prefix = self.part("projector")(prefix)
        else:  # a language model alone: no prefix
            llm = self.part("llm")
            prefix = torch.zeros(ids.shape[0], 0, llm.pos_embed.shape[1], device=ids.device)
        logits = self.part("llm")(prefix, ids)
        # Text position t predicts token t + 1 while t + 1 < length; the rest is ignored.
        t = ids.shape[1]
        targets = torch.full_like(ids, -1)
        targets[:, :-1] = ids[:, 1:]
        targets[torch.arange(t, device=ids.device).unsqueeze(0) + 1 >= lengths.unsqueeze(1)] = -1
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)

    def after_step(self):
        pass


def load_braid_parameters(model, spec, path):
    """Copies braid's values in; fails unless both models have exactly the same parameters."""
    ours = dict(model.named_parameters())
    theirs = [(p["name"], math.prod(p["shape"])) for p in spec["parameters"]]
    missing = sorted(set(ours) - {n for n, _ in theirs})
    extra = sorted({n for n, _ in theirs} - set(ours))
    if missing or extra:
        sys.exit(f"train_peer: parameters differ: only in torch {missing}, only in braid {extra}")
    values = np.fromfile(path, dtype=np.float32)
    at = 0
    with torch.no_grad():
        for name, count in theirs:
            if ours[name].numel() != count:
                sys.exit(f"train_peer: {name} has {ours[name].numel()} elements in torch, {count} in braid")
            ours[name].copy_(torch.from_numpy(values[at : at + count]).reshape(ours[name].shape))
            at += count
    if at != values.size:
        sys.exit(f"train_peer: {path} holds {values.size} floats, the parameters {at}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--compile", action="store_true", help="the model under torch.compile")
    p.add_argument("--tf32", action="store_true", help="TF32 tensor-core matmuls (cuda), as braid's BRAID_CUDA_TF32=1")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    # The same math on both sides: braid's CUDA backend runs cuBLAS in strict fp32 unless
    # BRAID_CUDA_TF32=1 (--tf32).
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    device = torch.device(a.device)

    with open(f"{a.dir}/spec.json") as f:
        spec = json.load(f)
    model = Clip(spec) if spec["topology"] == "contrastive" else Mllm(spec)
    load_braid_parameters(model, spec, f"{a.dir}/params.bin")
    count = sum(p.numel() for p in model.parameters())
    model = model.to(device)

    b, c, side, t = spec["batch"], spec["channels"], spec["image_size"], spec["text_tokens"]
    images = torch.from_numpy(np.fromfile(f"{a.dir}/images.bin", dtype=np.float32).reshape(b, c, side, side))
    ids = torch.from_numpy(np.fromfile(f"{a.dir}/tokens.bin", dtype=np.int32).reshape(b, t)).long()
    lengths = torch.full((b,), t, dtype=torch.long)
    images, ids, lengths = images.to(device), ids.to(device), lengths.to(device)
    run = torch.compile(model) if a.compile else model

    # As braid: AdamW, weight decay on matrices only (braid's Parameter::decay: rank >= 2).
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec["lr"],
        betas=(spec["beta1"], spec["beta2"]),
        eps=spec["eps"],
    )

    times, losses = [], []
    for i in range(spec["warmup"] + spec["steps"]):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = run(images, ids, lengths)
        loss.backward()
        opt.step()
        model.after_step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        took = time.perf_counter() - start
        losses.append(loss.item())
        if i >= spec["warmup"]:
            times.append(took)
    print(
        f"peer params={count} first_loss={losses[0]:.9g} second_loss={losses[1]:.9g} "
        f"median_step_s={statistics.median(times):.6f} torch={torch.__version__} threads={torch.get_num_threads()} "
        f"device={a.device}{' compiled' if a.compile else ''}"
    )


if __name__ == "__main__":
    main()
