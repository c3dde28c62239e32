"""Case tables of the bad-input sweep for `lbtrain train`, `python -m hyperspectral train` and
`mpiexec -n 2 lbtrain train`.

One case a line: `id category expect word...` (the format is read by sweep_cases.table, which
also says what the tags +SETUP, !CHECK, ?TEXT, ~SECONDS and %SKIP mean); an indented line
continues the one above.
"""

# Arguments after a tiny `lbtrain train` (sweep_cases.tr: synthetic scene, --out $TMP/run).
TRAIN = """
train-ok                  W ok    --time-budget 1 !metrics !only-run
train-gb-0                R early --global-batch 0
train-gb-neg              R early --global-batch=-1
train-gb-abc              R early --global-batch abc
train-gb-1e40             R early --global-batch 1e40
train-gb-10pow30          X early --global-batch 1000000000000000000000000000000 ?--global-batch
                                  ?"training samples"
train-gb-2pow53-plus-1    X early --global-batch 9007199254740993 ?--global-batch
                                  ?"training samples"
train-gb-above-trainset   X early --global-batch 100000 ?--global-batch ?"training samples"
train-epochs-0            R early --epochs 0
train-epochs-1.5          R early --epochs 1.5
train-lr-nan              W early --lr nan
train-lr-inf              W early --lr inf
train-lr-neg              W early --lr=-1
train-lr-0                W early --lr 0
train-lr-1e6-diverges     W clean --lr 1e6 --epochs 2 --time-budget 1 !metrics !nan-text
train-momentum-nan        W early --optimizer sgd --momentum nan
train-momentum-neg        R early --optimizer sgd --momentum=-1
train-wd-neg              R early --weight-decay=-1
train-wd-nan              W early --weight-decay nan
train-dropout-1.5         R early --dropout 1.5
train-dropout-nan         W early --dropout nan
train-seed-abc            R early --seed abc
train-threads-0           R early --threads 0
train-time-budget-nan     R early --time-budget nan
train-eval-batch-0        R early --eval-batch 0
train-keep-0              R early --keep 0
train-lr-gamma-0          R early --lr-gamma 0
train-unknown-flag        R early --bogus
train-policy-bogus        R early --policy fastest
train-workload-unknown    R early --workload nope
train-min-batch-too-big   X early --min-batch 64
train-out-file            O early --out @D/f +f ?--out
train-out-nonempty        O early --out @D/o +o ?--out
train-out-overwrite       O ok    --out @D/o --overwrite --time-budget 1 +o !o-metrics
train-out-overwrite-run   O ok    --out @D/a --overwrite --time-budget 1 +a +notes !a-metrics
                                  !notes
train-out-readonly        O early --out @D/ro/run +ro %root
train-out-under-file      O early --out @D/f/run +f ?--out
train-out-empty           O early --out "" ?--out
train-out-name-too-long   L early --out @LONG ?--out
train-out-dev-null        O early --out /dev/null ?--out
train-data-dir-missing    X early --data-dir @D/nope ?--data-dir
train-data-dir-file       X early --data-dir @D/f +f ?--data-dir
train-data-dir-real       X early --dataset indian_pines --data-dir @D/nope ?--data-dir
train-dataset-unknown     R early --dataset nope
train-dataset-no-files    R early --dataset pavia_u --data-dir @D/e --no-download +e
train-dataset-junk-mat    R early --dataset pavia_u --data-dir @D/e --no-download +mat
train-patch-even          R early --model hamida --patch-size 4
train-patch-0             R early --model hamida --patch-size 0
train-patch-neg           R early --model hamida --patch-size=-3
train-patch-above-scene   X early --model hamida --patch-size 101
train-patch-with-hu       X early --patch-size 5 ?--patch-size
train-pca-above-bands     X early --model hamida --pca 64
train-pca-neg             R early --pca=-1
train-disjoint-tiny-ratio X early --split disjoint --train-ratio 0.001
train-ratio-0             R early --train-ratio 0
train-ratio-1             X early --train-ratio 1
train-ratio-1.5           R early --train-ratio 1.5
train-ratio-nan           W early --train-ratio nan
train-fixed-no-per-class  X clean --split fixed --time-budget 1 !metrics
train-per-class-huge      X warn  --split fixed --train-per-class 100000 --time-budget 1 !warned
train-per-class-0         R early --split fixed --train-per-class 0
train-split-file-missing  R early --split-file @D/nope.npz
train-split-file-junk     R early --split-file @D/s.npz +s
train-split-other-scene   X early --split-file @D/s.npz +s10
train-split-out-of-range  X early --split-file @D/s.npz +sbig
train-resume-missing      R early --resume @D/nope
train-resume-junk         R early --resume @D/c.pt +c
train-resume-empty-folder R early --resume @D/e +e
train-resume-other-model  X refuse --resume @D/a --model hamida --out @D/b +a
train-devices-bogus       R early --devices bogus ?--devices
train-devices-cuda-absent R early --devices cuda:0 %gpu
train-devices-count       X early --devices cpu,cpu,cpu
train-devices-empty       R early --devices ""
train-slowdown-abc        R early --emulate-slowdown abc
train-slowdown-half       X early --emulate-slowdown 0.5
train-slowdown-nan        W early --emulate-slowdown nan
train-slowdown-inf        W early --emulate-slowdown inf
train-slowdown-length     X early --emulate-slowdown 1,2
train-slowdown-neg        R early --emulate-slowdown=-1
train-change-junk         R early --emulate-change x:1
train-change-epoch-0      X early --emulate-change 0:1
train-change-half         X early --emulate-change 1:0.5
train-config-missing      R early --config @D/nope.toml
train-config-folder       R early --config @D
train-config-bad-toml     R early --config @D/c.toml +toml-bad
train-config-unknown-key  R early --config @D/c.toml +toml-key
train-config-wrong-type   R early --config @D/c.toml +toml-type
train-config-nan-lr       W early --config @D/c.toml +toml-nan
train-config-not-utf8     R early --config @D/c.toml +toml-bytes
train-profiles-missing    R early --profiles @D/nope.json
train-profiles-world-size X early --profiles @FX
train-profiles-junk       R early --profiles @D/p.json +p{
train-profiles-workload   X early --profiles @D/p.json +p1 ?--profiles
train-plan-missing        R early --plan @D/nope.json
train-plan-junk           R early --plan @D/plan.json +plan[]
train-plan-and-profiles   X early --plan @D/plan.json --profiles @FX +plan
train-plan-other-batch    X warn  --plan @D/plan.json --time-budget 1 +plan !warned
sigint-train              S stop  --time-budget 1 --epochs 1000 ~15 !ckpt !stopped
"""
# The same through `python -m hyperspectral train`.
HS = """
hs-ok                     W ok    --time-budget 1 !metrics !only-run
hs-patch-even             R early --model hamida --patch-size 4
hs-data-dir-missing       X early --data-dir @D/nope ?--data-dir
hs-out-nonempty           O early --out @D/o +o
hs-lr-nan                 W early --lr nan
"""
# Under `mpiexec -n 2`.
MPI = """
mpi-train-ok              H ok    --time-budget 1 !metrics
mpi-argparse              H early --epochs 0
mpi-out-nonempty          H early --out @D/o +o
mpi-profiles-junk         H early --profiles @D/p.json +p{
mpi-profiles-world-size   H early --profiles @FX
mpi-devices-bogus         H early --devices cpu,bogus
mpi-devices-cuda-rank1    H early --devices cpu,cuda:0 %gpu
mpi-slowdown-length       H early --emulate-slowdown 1,2,3
mpi-data-dir-missing      H early --data-dir @D/nope
mpi-split-file-junk       H early --split-file @D/s.npz +s
mpi-resume-missing        H early --resume @D/nope
"""
