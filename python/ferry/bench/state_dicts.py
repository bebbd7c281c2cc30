"""Synthetic state dicts shaped like real models' (names, shapes, dtypes, tied weights, optimizer state), for the
checkpoint benchmark and its tests. Built on any torch device; on "meta" they cost no memory.

Each builder returns what a training loop hands to torch.distributed.checkpoint: {"model": the model's state
dict} and, with an optimizer, {"optim": optimizer.state_dict()} in torch's layout (per-parameter state keyed by
index, a CPU "step" scalar as non-capturable Adam keeps it, and the param groups). The model's state dict is a plain
dict, as torch.distributed.checkpoint.state_dict.get_model_state_dict returns it.
"""

# Decoder-only transformers: (vocab, hidden, layers, intermediate, key/value width, tied embeddings).
DECODERS = {
    "llama-1b": (128256, 2048, 16, 8192, 512, True),   # the shapes of Llama 3.2 1B: 1.24 B parameters
    "llama-7b": (32000, 4096, 32, 11008, 4096, False),  # the shapes of Llama 2 7B: 6.74 B parameters
}

# Recommendation-model embedding tables (rows per table, 128 columns of float32), Criteo-like cardinalities.
EMBEDDING_ROWS = [4_000_000, 3_000_000, 2_000_000, 1_000_000] + [100_000] * 6 + [10_000] * 8 + [1_000] * 8
EMBEDDING_DIM = 128


def decoder(torch, name, device, dtype):
    """A decoder's state_dict(): embeddings, per layer the attention and MLP projections and two RMSNorm weights,
    the final norm, and the output head (the embedding's tensor itself when tied, as state_dict() returns it)."""
    vocab, hidden, layers, inter, kv, tied = DECODERS[name]
    state = {}

    def weight(*shape):
        return torch.empty(shape, device=device, dtype=dtype).normal_(0, 0.02)

    state["model.embed_tokens.weight"] = weight(vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        state[p + "input_layernorm.weight"] = torch.ones(hidden, device=device, dtype=dtype)
        state[p + "self_attn.q_proj.weight"] = weight(hidden, hidden)
        state[p + "self_attn.k_proj.weight"] = weight(kv, hidden)
        state[p + "self_attn.v_proj.weight"] = weight(kv, hidden)
        state[p + "self_attn.o_proj.weight"] = weight(hidden, hidden)
        state[p + "post_attention_layernorm.weight"] = torch.ones(hidden, device=device, dtype=dtype)
        state[p + "mlp.gate_proj.weight"] = weight(inter, hidden)
        state[p + "mlp.up_proj.weight"] = weight(inter, hidden)
        state[p + "mlp.down_proj.weight"] = weight(hidden, inter)
    state["model.norm.weight"] = torch.ones(hidden, device=device, dtype=dtype)
    state["lm_head.weight"] = state["model.embed_tokens.weight"] if tied else weight(vocab, hidden)
    return state


def resnet50(torch, device):
    """ResNet-50's state_dict() in float32, torchvision's names: convolutions, batch norms with their running
    statistics and int64 batch counters, the classifier."""
    state = {}

    def conv(name, out_ch, in_ch, k):
        state[name + ".weight"] = torch.empty(out_ch, in_ch, k, k, device=device).normal_(0, 0.05)

    def bn(name, ch):
        state[name + ".weight"] = torch.ones(ch, device=device)
        state[name + ".bias"] = torch.zeros(ch, device=device)
        state[name + ".running_mean"] = torch.zeros(ch, device=device)
        state[name + ".running_var"] = torch.ones(ch, device=device)
        state[name + ".num_batches_tracked"] = torch.zeros((), dtype=torch.int64, device=device)

    conv("conv1", 64, 3, 7)
    bn("bn1", 64)
    in_ch = 64
    for layer, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        for b in range(blocks):
            p = f"layer{layer}.{b}."
            conv(p + "conv1", width, in_ch, 1)
            bn(p + "bn1", width)
            conv(p + "conv2", width, width, 3)
            bn(p + "bn2", width)
            conv(p + "conv3", width * 4, width, 1)
            bn(p + "bn3", width * 4)
            if b == 0:
                conv(p + "downsample.0", width * 4, in_ch, 1)
                bn(p + "downsample.1", width * 4)
            in_ch = width * 4
    state["fc.weight"] = torch.empty(1000, 2048, device=device).normal_(0, 0.01)
    state["fc.bias"] = torch.zeros(1000, device=device)
    return state


def embeddings(torch, device):
    """A recommendation model's embedding tables, float32."""
    return {f"embedding_bags.{i}.weight": torch.empty(rows, EMBEDDING_DIM, device=device).uniform_(-0.01, 0.01)
            for i, rows in enumerate(EMBEDDING_ROWS)}


def adam_state(torch, model_state, device):
    """optimizer.state_dict() of Adam over the model's floating-point parameters (a tied tensor once): fp32
    moments on the device and a CPU float32 step per parameter, and one param group."""
    params, seen = [], set()
    for name, t in model_state.items():
        if t.is_floating_point() and "running_" not in name and id(t) not in seen:
            seen.add(id(t))
            params.append(t)
    state = {}
    for i, p in enumerate(params):
        state[i] = {"step": torch.tensor(100.0),
                    "exp_avg": torch.empty(p.shape, device=device, dtype=torch.float32).normal_(0, 1e-3),
                    "exp_avg_sq": torch.empty(p.shape, device=device, dtype=torch.float32).uniform_(0, 1e-6)}
    groups = [{"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False,
               "maximize": False, "foreach": None, "capturable": False, "differentiable": False, "fused": None,
               "params": list(range(len(params)))}]
    return {"state": state, "param_groups": groups}


# name -> (description, build(torch, device) -> state dict)
STATE_DICTS = {
    "llama-1b": ("Llama 3.2 1B shapes, bf16 weights (tied embeddings)",
                 lambda torch, device: {"model": decoder(torch, "llama-1b", device, torch.bfloat16)}),
    "llama-1b-adam": ("Llama 3.2 1B shapes, bf16 weights (tied embeddings) + fp32 Adam moments",
                      lambda torch, device: _with_adam(torch, decoder(torch, "llama-1b", device, torch.bfloat16),
                                                       device)),
    "llama-7b": ("Llama 2 7B shapes, bf16 weights",
                 lambda torch, device: {"model": decoder(torch, "llama-7b", device, torch.bfloat16)}),
    "llama-7b-adam": ("Llama 2 7B shapes, bf16 weights + fp32 Adam moments (67 GB)",
                      lambda torch, device: _with_adam(torch, decoder(torch, "llama-7b", device, torch.bfloat16),
                                                       device)),
    "resnet50-adam": ("ResNet-50, fp32 weights and batch-norm buffers + fp32 Adam moments",
                      lambda torch, device: _with_adam(torch, resnet50(torch, device), device)),
    "dlrm-embeddings": ("26 embedding tables of 1K-4M rows x 128 fp32",
                        lambda torch, device: {"model": embeddings(torch, device)}),
}
DEFAULT_STATE_DICTS = ["llama-1b", "resnet50-adam", "llama-1b-adam", "dlrm-embeddings", "llama-7b"]


def _with_adam(torch, model_state, device):
    return {"model": model_state, "optim": adam_state(torch, model_state, device)}


def tensors(obj):
    """Every tensor of a nested state dict, in order, an object met twice once."""
    out, seen = [], set()

    def walk(o):
        if id(o) in seen:
            return
        seen.add(id(o))
        if hasattr(o, "untyped_storage"):
            out.append(o)
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)

    walk(obj)
    return out


def footprint(torch, state):
    """(tensor count, bytes of distinct device tensors, bytes of CPU tensors)."""
    ts = tensors(state)
    device_bytes = sum(t.nbytes for t in ts if t.device.type != "cpu")
    return len(ts), device_bytes, sum(t.nbytes for t in ts if t.device.type == "cpu")
