"""Case table of the bad-input sweep for the library: each body runs as main() of a `python -c`
script (LIB_PRELUDE + body + LIB_END), read by sweep_cases.lib_cases."""

LIB_PRELUDE = """\
import json, math, sys
import numpy as np, torch
from lbtrain import balanced_loader as BL, load_profiles as LP, plan_batches as P
from lbtrain import sync_gradients as SG
from lbtrain.balancer import MAX_GLOBAL_BATCH, ReplicaSpeed as RS
from lbtrain.comm import SingleProcessCommunicator
from lbtrain.data import BalancedBatchSampler as BS
ds = torch.utils.data.TensorDataset(torch.zeros(10, 2))
model = torch.nn.Linear(2, 1)
model(torch.ones(1, 2)).sum().backward()
comm, plan = SingleProcessCommunicator(), P([1.0, 2.0], 8)
def good(p, sizes=None):
    assert sizes is None or tuple(p.batch_sizes) == sizes, p.batch_sizes
    assert sum(p.batch_sizes) == p.global_batch_size and min(p.batch_sizes) >= 0, p
    assert "NaN" not in p.to_json() and "Infinity" not in p.to_json(), p.to_json()
def main():
"""
LIB_END = """
try:
    main()
except Exception as e:
    kind = next(k.__name__ for k in type(e).__mro__ if k.__module__ == "builtins")
    print(f"error: {kind}: " + " ".join(str(e).split()), file=sys.stderr)
    sys.exit(2)
"""
# `id expect ?TEXT... :: body` ("; " separates statements); an exception: `error: Type: msg`
LIB = """
lib-plan-10pow30     refuse ?ValueError ?2**53 :: P([1.0, 2.0], 10**30)
lib-plan-2pow53      ok :: good(P([1.0, 3.0], MAX_GLOBAL_BATCH, "cost"))
lib-plan-ratio-1e300 ok :: good(P([1.0, 1e300], 64))
lib-plan-ratio-cost  ok :: good(P([RS(1e-150, alpha=1e-3), RS(1e150)], 64, "cost"))
lib-plan-numpy       ok :: speeds = [np.float64(1), np.float32(3)]
                           good(P(speeds, np.int64(8), min_batch=np.int8(1)), (2, 6))
lib-plan-ndarray     ok :: good(P(np.array([100.0, 300.0]), 8), (2, 6))
lib-plan-generator   ok :: good(P((s for s in [100.0, 300.0]), 8), (2, 6))
lib-plan-bool-batch  refuse ?TypeError ?global_batch_size :: P([1.0, 2.0], True)
lib-plan-bool-speed  refuse ?TypeError :: P([True, 2.0], 8)
lib-plan-none-speeds refuse ?TypeError ?ranks :: P(None, 8)
lib-plan-str-speeds  refuse ?TypeError ?ranks :: P("12", 8)
lib-plan-float-batch refuse ?TypeError :: P([1.0, 2.0], 64.5)
lib-plan-nan-speed   refuse ?ValueError :: P([math.nan, 1.0], 8)
lib-plan-inf-speed   refuse ?ValueError :: P([math.inf, 1.0], 8)
lib-plan-zero-speed  refuse ?ValueError :: P([0.0, 1.0], 8)
lib-plan-empty       refuse ?ValueError :: P([], 8)
lib-plan-policy      refuse ?ValueError :: P([1.0], 8, "fastest")
lib-plan-min-batch   refuse ?ValueError :: P([1.0, 1.0, 1.0], 2, min_batch=1)
lib-plan-caps-small  refuse ?ValueError :: P([1.0, 1.0], 64, caps=[1, 1])
lib-plan-caps-length refuse ?ValueError :: P([1.0, 1.0], 64, caps=[10])
lib-speed-neg-alpha  refuse ?ValueError :: RS(10.0, alpha=-1.0)
lib-speed-bool-cap   refuse ?"TypeError: cap=" :: RS(10.0, cap=True)
lib-speed-str        refuse ?"TypeError: throughput=" :: RS("10")
lib-loader-rank      refuse ?ValueError :: BL([1.0, 2.0], ds, global_batch_size=4, rank=5)
lib-loader-no-batch  refuse ?global_batch_size :: BL([1.0, 2.0], ds, rank=0)
lib-loader-bool-rank refuse ?TypeError :: BL([1.0, 2.0], ds, global_batch_size=4, rank=True)
lib-loader-mismatch  refuse ?ValueError :: BL(plan, ds, global_batch_size=16, rank=0)
lib-loader-numpy     ok :: b = BL([1.0, 2.0], ds, global_batch_size=np.int64(4), rank=np.int64(1))
                           assert sum(len(x[0]) for x in b) > 0 and 0 < b.weight <= 1
lib-sampler-empty    refuse ?ValueError :: BS(0, plan, 0)
lib-sampler-bool     refuse ?TypeError :: BS(10, plan, True)
lib-sampler-float    refuse ?TypeError :: BS(10.0, plan, 0)
lib-sync-nan         refuse ?ValueError ?weight :: SG(model, math.nan, comm)
lib-sync-bool        refuse ?TypeError :: SG(model, True, comm)
lib-sync-none        refuse ?TypeError :: SG(model, None, comm)
lib-sync-above-1     refuse ?ValueError :: SG(model, 1.5, comm)
lib-sync-str-model   refuse ?"TypeError: model=" :: SG("model", 1.0, comm)
lib-sync-numpy       ok :: SG(model, np.float32(1.0), comm)
                           assert all(torch.isfinite(p.grad).all() for p in model.parameters())
lib-sync-not-summing refuse ?ValueError ?"sum to 0.5, not 1" :: SG(model, 0.5, comm)
lib-load-missing     refuse ?ValueError ?nope.json :: LP("@D/nope.json")
lib-load-ok          ok :: assert len(LP("@FX")) == 3
lib-load-world-size  refuse ?ValueError :: LP("@FX", world_size=2)
lib-load-none        refuse ?"TypeError: path=" :: LP(None)
lib-load-bool-world  refuse ?"TypeError: world_size=" :: LP("@FX", world_size=True)
"""
