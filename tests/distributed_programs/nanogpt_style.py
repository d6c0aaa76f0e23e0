"""nanoGPT style: `ddp_local_rank`, `device = f"cuda:{ddp_local_rank}"`, autocast and a GradScaler, batches pinned and
moved with non_blocking. `--device cuda` names the bare device, as a config override would, without `set_device`."""

import argparse
import math
import os
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 32, block: int = 16, width: int = 32) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(block, width)
        self.attn = nn.MultiheadAttention(width, 4, batch_first=True)
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor):
        device = idx.device
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=device)
        x = self.wte(idx) + self.wpe(pos)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=device), diagonal=1)
        x = x + self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]
        logits = self.head(self.ln(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="")
    parser.add_argument("--max-iters", type=int, default=6)
    args = parser.parse_args()
    ddp = int(os.environ.get("RANK", -1)) != -1
    if ddp:
        init_process_group(backend="nccl")
        ddp_rank = int(os.environ["RANK"])
        ddp_local_rank = int(os.environ["LOCAL_RANK"])
        device = args.device or f"cuda:{ddp_local_rank}"
        if not args.device:
            torch.cuda.set_device(device)
        seed_offset = ddp_rank
    else:
        device, seed_offset = "cuda", 0
    torch.manual_seed(1337 + seed_offset)
    torch.backends.cuda.matmul.allow_tf32 = True
    device_type = "cuda" if "cuda" in device else "cpu"
    dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)
    data = torch.randint(0, 32, (4096,))

    def get_batch():
        ix = torch.randint(len(data) - 16, (8,))
        x = torch.stack([data[i:i + 16] for i in ix])
        y = torch.stack([data[i + 1:i + 17] for i in ix])
        if device_type == "cuda":
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y

    torch.manual_seed(1337)
    model = TinyGPT()
    model.to(device)
    scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=False)
    if ddp:
        model = DDP(model, device_ids=[ddp_local_rank])
    X, Y = get_batch()
    for it in range(args.max_iters):
        lr = 1e-3 * 0.5 * (1 + math.cos(math.pi * it / args.max_iters))
        for group in optimizer.param_groups:
            group["lr"] = lr
        with ctx:
            logits, loss = model(X, Y)
        X, Y = get_batch()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    if ddp:
        destroy_process_group()


if __name__ == "__main__":
    main()
