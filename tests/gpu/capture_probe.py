"""Probe (one GPU): what a broken CUDA-graph capture leaves behind in torch, and what mends it.

    python3 tests/gpu/capture_probe.py     # each case in a fresh process; output: tests/gpu/results/capture_probe_*.log
"""
import subprocess
import sys
import textwrap

COMMON = """
import torch, warnings
x = torch.randn(1 << 16, device="cuda")
def reads_back(t):
    n = int((t > 0).sum())
    return t[:n] * 2
def broken_capture():
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            reads_back(x)
    except Exception as e:
        print("capture failed:", type(e).__name__, str(e)[:120].replace(chr(10), ' '))
    torch.cuda.synchronize()
    return g
def check(tag):
    try:
        torch.randn(8, device="cuda"); torch.cuda.synchronize(); print(tag, "randn OK")
    except Exception as e:
        print(tag, "randn FAILS:", str(e)[:150].replace(chr(10), ' '))
    try:
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2):
            y = x * 2
        g2.replay(); torch.cuda.synchronize(); print(tag, "second capture OK")
    except Exception as e:
        print(tag, "second capture FAILS:", str(e)[:150].replace(chr(10), ' '))
"""
CASES = {
    "none": "g = broken_capture(); check('none')",
    "reset": "g = broken_capture()\ntry:\n    g.reset(); print('reset ok')\nexcept Exception as e: print('reset raised', e)\ncheck('reset')",
    "rng_graph": """g = broken_capture()
try:
    g3 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g3):
        z = torch.randn(8, device='cuda')
    print('rng graph captured')
except Exception as e: print('rng graph raised', str(e)[:150])
check('rng_graph')""",
    "clone_state": """gen = torch.cuda.default_generators[0]
fresh = gen.clone_state()
stream = torch.cuda.current_stream()
g = broken_capture()
print('stream restored after the failure:', torch.cuda.current_stream() == stream)
try:
    gen.graphsafe_set_state(fresh); print('graphsafe_set_state ok')
except Exception as e: print('graphsafe_set_state raised', str(e)[:150])
check('clone_state')""",
    "index_copy_sync_debug": """
slots = torch.randperm(1 << 12, device='cuda')[:1024]
cache = torch.zeros(1 << 12, 8, device='cuda'); src = torch.randn(1024, 8, device='cuda')
torch.cuda.set_sync_debug_mode('warn')
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter('always')
    cache.index_copy_(0, slots, src); torch.cuda.synchronize()
print('index_copy_ warnings:', [str(i.message)[:80] for i in w])
torch.cuda.set_sync_debug_mode(0)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    cache.index_copy_(0, slots, src)
g.replay(); torch.cuda.synchronize(); print('index_copy_ captured and replayed OK')
""",
}
if __name__ == "__main__":
    for name, body in CASES.items():
        out = subprocess.run([sys.executable, "-c", COMMON + textwrap.dedent(body)], capture_output=True, text=True,
                             timeout=120)
        print(f"== {name} (exit {out.returncode})\n{out.stdout}{out.stderr[-600:]}")
