#!/usr/bin/python3
"""flow-ckpt export and import against the Python packages users trade
GPT-2 weights with: `safetensors` (PyPI) and, when it is installed,
`transformers`.  Run it with a python3 that has Debian's python3-torch and
`pip install safetensors [transformers]` (a venv made with
--system-site-packages; scripts/setup.sh makes one):

    VENV/bin/python tests/ref/interop_check.py --flow-bin BUILD/bin \\
        --work-dir /tmp/interop [--require-transformers]

Export (a checkpoint flow-train wrote after 2 steps of a model whose
vocabulary is padded):
- `flow-ckpt export` to f32 and to bf16 split by --max-shard-size: every
  file opens with safetensors.safe_open, the names and shapes are
  transformers' GPT-2 (Conv1D [in, out], padded rows dropped, no lm_head),
  the f32 tensors are flow's bit for bit and the bf16 ones as torch rounds
  them, and the index names each tensor's file;
- the logits: flow's own forward is flow-train's step-1 loss from those
  weights (--init) on its dumped batch; the project's PyTorch GPT-2
  (torch_gpt.gpt_forward) on the loaded tensors must give that loss within
  1e-5 relative, and transformers' GPT2LMHeadModel.from_pretrained of the
  directory the same logits within 1e-5 (of their largest magnitude) and
  the same loss.
Import (weights made in PyTorch, written with safetensors.torch.save_file,
with the attn.bias buffers and the tied lm_head.weight older checkpoints
carry):
- `flow-ckpt import` onto a one-rank plan and a 2x2 (dp,tp) plan;
- `flow-train --init` from each trains 4 steps; every step's loss and
  grad_norm equal PyTorch's (torch_gpt.Trainer from the same weights on
  flow's batches) within 1e-5 relative, on one rank and on four;
- exporting the imported checkpoint gives back the source's tensors bit
  for bit.
Prints one ok/FAIL line per check and PASS or FAIL last; exit 0, 1 (a
check failed) or 77 (safetensors missing, or transformers missing with
--require-transformers).
"""
import argparse
import json
import os
import subprocess
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from safetensors import safe_open
    from safetensors.torch import save_file
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402

MODEL = "gpt:layers=2,heads=4,dim=64,vocab=300,seq=32"
B, T = 4, 32
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
          "mlp.c_proj.weight")
TOL = 1e-5

failures = 0


def check(ok, what):
    global failures
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures += 1


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


class Flow:
    def __init__(self, bindir, work):
        self.bindir, self.work = bindir, work

    def run(self, prog, *args, stdout=None):
        cmd = [os.path.join(self.bindir, prog), *map(str, args)]
        r = subprocess.run(cmd, cwd=self.work, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: "
                               f"{r.stderr.strip()}")
        if stdout:
            with open(os.path.join(self.work, stdout), "w") as f:
                f.write(r.stdout)
        return r.stdout

    def path(self, *parts):
        return os.path.join(self.work, *parts)


def hf_name(name):
    return "transformer." + (name + ".weight" if name in ("wte", "wpe")
                             else name)


def to_hf(weights, cfg):
    """flow's arrays {name: array} -> transformers' tensors."""
    out = {}
    for name, a in weights.items():
        t = torch.from_numpy(np.ascontiguousarray(a))
        if name == "wte":
            t = t[:cfg["vocab"]]
        if name.endswith(CONV1D):
            t = t.T
        out[hf_name(name)] = t.contiguous()
    return out


def from_hf(tensors, cfg):
    """transformers' tensors -> flow's f32 arrays (padded rows zero)."""
    out = {}
    for name, shape in torch_gpt.param_shapes(cfg):
        t = tensors[hf_name(name)].float()
        if name.endswith(CONV1D):
            t = t.T
        if name == "wte":
            t = torch.cat([t, torch.zeros(cfg["vp"] - cfg["vocab"],
                                          cfg["dim"])])
        out[name] = t.contiguous().numpy()
        assert out[name].shape == shape, name
    return out


def load_dir(d):
    """{name: tensor} of every safetensors file of an export directory,
    and {name: file} from its index (None without one)."""
    index = None
    if os.path.exists(os.path.join(d, "model.safetensors.index.json")):
        with open(os.path.join(d, "model.safetensors.index.json")) as f:
            index = json.load(f)["weight_map"]
        files = sorted(set(index.values()))
    else:
        files = ["model.safetensors"]
    tensors, where = {}, {}
    for fn in files:
        with safe_open(os.path.join(d, fn), framework="pt") as f:
            for k in f.keys():
                tensors[k] = f.get_tensor(k)
                where[k] = fn
    return tensors, index, where


def hf_config(cfg):
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": cfg["vocab"], "n_positions": cfg["seq"],
            "n_ctx": cfg["seq"], "n_embd": cfg["dim"],
            "n_layer": cfg["layers"], "n_head": cfg["heads"],
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "tie_word_embeddings": True}


def step1_batch(flow, ckpt, tag):
    """flow-train --init ckpt for one step: (its loss, its batch)."""
    flow.run("flow-train", "--model", MODEL, "--batch", B, "--seq-len", T,
             "--peak-gflops", 0, "--steps", 1, "--data", "data", "--init",
             ckpt, "--dump-batches", f"{tag}.batches", stdout=f"{tag}.tsv")
    with open(flow.path(f"{tag}.tsv")) as f:
        _, rows = torch_gpt.read_flow_tsv(f.read())
    batches = torch_gpt.read_batches(flow.path(f"{tag}.batches"), 1, 1, B, T)
    return rows[0]["loss"], batches[0, 0]


def check_transformers(d, cfg, batch, flow_loss, what):
    """GPT2LMHeadModel.from_pretrained(d): logits and loss."""
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(d, torch_dtype=torch.float32)
    model.eval()
    inp = torch.from_numpy(batch[0])
    tgt = torch.from_numpy(batch[1])
    with torch.no_grad():
        logits = model(inp).logits
    tensors, _, _ = load_dir(d)
    p = {k: torch.from_numpy(v) for k, v in from_hf(tensors, cfg).items()}
    with torch.no_grad():
        ref, _ = torch_gpt.gpt_forward(p, cfg, inp)
    ref = ref[..., :cfg["vocab"]]
    err = (logits - ref).abs().max().item() / ref.abs().max().item()
    check(err <= TOL, f"{what}: transformers' logits equal the project's "
                      f"PyTorch GPT-2's (max diff {err:.1e} of the largest "
                      f"<= {TOL})")
    loss = F.cross_entropy(logits.reshape(-1, cfg["vocab"]),
                           tgt.reshape(-1)).item()
    check(rel(loss, flow_loss) <= TOL,
          f"{what}: transformers' loss {loss:.9g} equals flow's "
          f"{flow_loss:.9g} (rel {rel(loss, flow_loss):.1e} <= {TOL})")


def export_checks(flow, cfg, use_tf):
    flow.run("flow-train", "--model", MODEL, "--batch", B, "--seq-len", T,
             "--peak-gflops", 0, "--steps", 2, "--ckpt-dir", "ck", "--data",
             "data")
    ck = "ck/step-00000002"
    _, weights = torch_gpt.read_checkpoint(flow.path(ck),
                                           names=[n for n, _ in
                                                  torch_gpt.param_shapes(cfg)])
    want = to_hf(weights, cfg)

    flow.run("flow-ckpt", "export", ck, "-o", "hf")
    tensors, index, _ = load_dir(flow.path("hf"))
    with safe_open(flow.path("hf", "model.safetensors"), framework="pt") as f:
        meta = f.metadata()
    check(index is None and meta == {"format": "pt"},
          "export: one model.safetensors, metadata format pt")
    check(set(tensors) == set(want) and
          all(tensors[k].dtype == torch.float32 for k in tensors),
          f"export: safetensors opens {len(tensors)} f32 tensors with "
          f"transformers' GPT-2 names (no lm_head)")
    check(all(torch.equal(tensors[k], want[k]) for k in want),
          "export: every tensor is flow's bit for bit (Conv1D [in, out], "
          f"{cfg['vp'] - cfg['vocab']} padded rows dropped)")

    flow.run("flow-ckpt", "export", ck, "--dtype", "bf16",
             "--max-shard-size", "40K", "-o", "hf-bf16")
    t16, index, where = load_dir(flow.path("hf-bf16"))
    check(index is not None and len(set(index.values())) > 1 and
          index == where,
          f"export --max-shard-size: {len(set(where.values()))} files, the "
          "index names each tensor's")
    check(set(t16) == set(want) and
          all(torch.equal(t16[k], want[k].to(torch.bfloat16)) for k in want),
          "export --dtype bf16: every tensor as torch rounds flow's")

    flow_loss, batch = step1_batch(flow, ck, "export")
    p = {k: torch.from_numpy(v) for k, v in from_hf(tensors, cfg).items()}
    with torch.no_grad():
        _, loss = torch_gpt.gpt_forward(p, cfg, torch.from_numpy(batch[0]),
                                        torch.from_numpy(batch[1]))
    loss = loss.item()
    check(rel(loss, flow_loss) <= TOL,
          f"export: the project's PyTorch GPT-2 on the loaded tensors gives "
          f"flow's loss {flow_loss:.9g} (rel {rel(loss, flow_loss):.1e} <= "
          f"{TOL})")
    if use_tf:
        check_transformers(flow.path("hf"), cfg, batch, flow_loss, "export")


def make_pytorch_weights(cfg):
    """GPT-2 weights made in PyTorch, as transformers names them."""
    g = torch.Generator().manual_seed(11)
    C, V = cfg["dim"], cfg["vocab"]
    t = {}
    for name, shape in torch_gpt.param_shapes(cfg):
        if name == "wte":
            shape = (V, C)
        elif name.endswith(CONV1D):
            shape = shape[::-1]
        x = 0.02 * torch.randn(shape, generator=g)
        if name.endswith("weight") and len(shape) == 1:  # layer norms
            x = 1 + 0.1 * torch.randn(shape, generator=g)
        t[hf_name(name)] = x.contiguous()
    extra = {}
    for i in range(cfg["layers"]):  # buffers older checkpoints carry
        extra[f"transformer.h.{i}.attn.bias"] = torch.tril(
            torch.ones(cfg["seq"], cfg["seq"])).view(1, 1, cfg["seq"],
                                                     cfg["seq"])
    extra["lm_head.weight"] = t["transformer.wte.weight"].clone()
    return t, extra


def train_rows(flow, tag, *args):
    out = flow.run("flow-train", "--peak-gflops", 0, "--data", "data",
                   *args, stdout=f"{tag}.tsv")
    _, rows = torch_gpt.read_flow_tsv(out)
    return [r for r in rows if r["phase"] == "train"]


def import_checks(flow, cfg, use_tf):
    t, extra = make_pytorch_weights(cfg)
    os.makedirs(flow.path("src"))
    save_file({**t, **extra}, flow.path("src", "model.safetensors"),
              metadata={"format": "pt"})
    with open(flow.path("src", "config.json"), "w") as f:
        json.dump(hf_config(cfg), f)

    for p, mesh in (("one", ["--mesh", "1", "--axes", "dp"]),
                    ("tp", ["--mesh", "2x2", "--axes", "dp,tp"])):
        flow.run("flow-plan", "--model", MODEL, *mesh, "--batch", B,
                 "--seq-len", T, "-o", f"{p}.plan")
        flow.run("flow-ckpt", "import", "src", "--plan", f"{p}.plan", "-o",
                 f"imp-{p}")
    info = flow.run("flow-ckpt", "info", "imp-tp")
    check("# mesh\t2x2" in info and "# state\tcontents\tweights" in info,
          "import --plan tp.plan: a weights checkpoint for the 2x2 mesh")

    hp = torch_gpt.Hyper(steps=4)
    one = train_rows(flow, "init-one", "--model", MODEL, "--batch", B,
                     "--seq-len", T, "--init", "imp-one",
                     "--dump-batches", "init.batches", *hp.flow_args())
    plan_args = hp.flow_args()  # the plan gives grad-accum
    i = plan_args.index("--grad-accum")
    del plan_args[i:i + 2]
    four = train_rows(flow, "init-tp", "--plan", "tp.plan", "--nproc", 4,
                      "--init", "imp-tp", *plan_args)
    torch_gpt.set_deterministic(1)
    batches = torch_gpt.read_batches(flow.path("init.batches"), hp.steps, 1,
                                     B, T)
    tr = torch_gpt.Trainer(cfg, from_hf(t, cfg), hp)
    ref = [tr.step([(mb[0], mb[1]) for mb in batches[s]])
           for s in range(hp.steps)]
    for what, rows in (("1 rank", one), ("2x2 (dp,tp), 4 ranks", four)):
        worst = max(max(rel(r["loss"], w["loss"]),
                        rel(r["grad_norm"], w["grad_norm"]))
                    for r, w in zip(rows, ref))
        check(len(rows) == hp.steps and worst <= TOL,
              f"import, flow-train --init on {what}: {len(rows)} steps' "
              f"losses and grad norms equal PyTorch's from the same weights "
              f"(worst rel {worst:.1e} <= {TOL})")

    flow.run("flow-ckpt", "export", "imp-tp", "-o", "back")
    back, _, _ = load_dir(flow.path("back"))
    check(set(back) == set(t) and all(torch.equal(back[k], t[k]) for k in t),
          "import then export gives the PyTorch tensors back bit for bit "
          "(attn.bias and lm_head.weight skipped)")
    if use_tf:
        flow_loss, batch = step1_batch(flow, "imp-one", "import")
        check_transformers(flow.path("src"), cfg, batch, flow_loss,
                           "import")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flow-bin", required=True)
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--require-transformers", action="store_true")
    a = ap.parse_args()
    try:
        import transformers
        use_tf = True
        print(f"# transformers {transformers.__version__}, torch "
              f"{torch.__version__}, safetensors "
              f"{__import__('safetensors').__version__}")
    except ImportError:
        if a.require_transformers:
            print("skip: transformers is not installed")
            return 77
        use_tf = False
        print("# transformers not installed: its checks are left out")
    torch_gpt.set_deterministic(1)
    os.makedirs(a.work_dir, exist_ok=True)
    flow = Flow(os.path.abspath(a.flow_bin), a.work_dir)
    with open(flow.path("corpus.txt"), "w") as f:
        for i in range(3000):
            f.write(f"the quick fox jumps over the lazy dog, line {i}.\n")
    flow.run("flow-shard", "-q", "-o", "data", "--val-tokens", "8K",
             "corpus.txt")
    cfg = torch_gpt.parse_spec(MODEL)
    export_checks(flow, cfg, use_tf)
    import_checks(flow, cfg, use_tf)
    print("PASS" if not failures else f"FAIL: {failures} checks failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
