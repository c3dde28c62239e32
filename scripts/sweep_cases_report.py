"""Case tables of the bad-input sweep for `lbtrain profile` and `lbtrain balance-report`, whole
command lines, and pipes.

The line format is read by sweep_cases.table (`id category expect word...`); EDITS by
sweep_cases.edit_cases.
"""

# Arguments after `lbtrain profile --threads 1 --time-budget 10`.
PROFILE = """
profile-ok                W ok    --time-budget 1 --batch-sizes 16,32 -o @D/p.json !p-json !only-p
profile-default-output    O ok    --time-budget 1 --batch-sizes 16,32 !profiles ?profiles.json
profile-output-folder     O early --output @D ?--output
profile-output-no-folder  O early --output @D/no/p.json
profile-output-under-file O early --output @D/f/p.json +f
profile-o-under-file      O early -o @D/f/p.json +f ?--output
profile-output-empty      O early --output ""
profile-o-empty           O early -o "" ?--output
profile-output-too-long   L early --output @LONG.json ?--output ?"File name too long"
profile-budget-0          R early --time-budget 0
profile-budget-neg        R early --time-budget=-1
profile-budget-nan        R early --time-budget nan
profile-budget-inf        H early --time-budget inf
profile-batch-sizes-0     R early --batch-sizes 0,16
profile-batch-sizes-abc   R early --batch-sizes abc
profile-max-batch-0       R early --max-batch 0
profile-repeats-0         R early --repeats 0
profile-warmup-neg        R early --warmup=-1
profile-reference-0       R early --reference-batch 0
profile-workload-unknown  R early --workload nope
profile-workload-module   R early --workload nosuchpkg.mod:make
profile-devices-bogus     R early --devices bogus
profile-slowdown-half     X early --emulate-slowdown 0.5
sigint-startup            S int   --output @D/p.json ~0.7 !no-p
sigint-profile            S int   --time-budget 20 --output @D/p.json ~6 !no-p
"""
# Arguments after `lbtrain balance-report --profiles FIXTURE --global-batch 64`.
REPORT = """
br-ok                     W ok    !only-none ?"global batch 64"
br-json                   W ok    --format json !stdout-json
br-gb-0                   R early --global-batch 0
br-gb-10pow30             X early --global-batch 1000000000000000000000000000000 ?2**53
br-gb-2pow53              W ok    --global-batch 9007199254740992 --format json !stdout-json
br-gb-below-ranks         X clean --global-batch 2
br-min-batch-too-big      X early --min-batch 30
br-reference-w-profiles   X early --reference-batch 32
br-plot-folder            O early --plot @D ?--plot
br-plot-no-ext            O early --plot @D/report
br-plot-unknown-ext       O early --plot @D/report.xyz
br-plot-no-folder         O early --plot @D/no/report.png
br-plot-too-long          L early --plot @LONG.png ?--plot ?"File name too long"
br-plot-ok                O ok    --plot @D/r.png !r-png !only-r
br-profiles-folder        R early --profiles @D
br-profiles-dev-null      R early --profiles /dev/null
br-profiles-missing       X early --profiles @D/p.json ?p.json
br-profiles-junk          X early --profiles @D/p.json +p{ ?p.json
br-save-with-profiles     O early --save-profiles x.json ?--save-profiles
"""
# Arguments after `lbtrain balance-report --threads 1 --time-budget 10` (profiling now).
REPORT_NOW = """
br-profile-now-ok         O ok    --time-budget 1 --batch-sizes 16,32 !only-none
br-save-folder            O early --save-profiles @D
br-save-too-long          L early --save-profiles @LONG.json ?--save-profiles
                                  ?"File name too long"
br-plot-folder-profiling  L early --plot @D
br-min-batch-profiling    L early --global-batch 4 --min-batch 8
sigint-report             S int   --time-budget 20 ~6
"""
# Whole command lines.
RAW = """
hs-typo-verb              R early @PY -m hyperspectral trian
hs-no-verb                R early @PY -m hyperspectral
lbtrain-no-verb           R early @LB
mpi-report-plot-folder    H early @MPI -n 2 @LB balance-report --time-budget 10 --plot @D
mpi-profile-out-folder    H early @MPI -n 2 @LB profile --time-budget 10 --output @D
sigint-mpi-profile        S int-mpi @MPI -n 2 @LB profile --time-budget 20 -o @D/p.json ~8
                                    !no-p !one-interrupted
"""
# Shell pipelines (bash -o pipefail -c).
PIPES = """
pipe-head-json  S pipe  @LB balance-report --profiles @FX --global-batch 64 --format json
                        | head -c 10 !no-broken
pipe-head-big   S pipe  @LB balance-report --profiles @D/big.json --global-batch 100000
                        | head -n 1 +big !141 !no-broken
pipe-true       S pipe  @LB balance-report --profiles @FX --global-batch 64 | true !no-ignored
pipe-dev-full   S fail1 @LB balance-report --profiles @FX --global-batch 64 > /dev/full
                        ?"standard output"
"""
# A broken profiles file: `id path = JSON value` or `id del path`, applied to the fixture.
EDITS = """
br-profiles-format           format = "other"
br-profiles-version          version = 99
br-profiles-world-size       world_size = 2
br-profiles-world-size-str   world_size = "3"
br-profiles-no-ranks         profiles = []
br-profiles-alpha-above-step profiles.0.alpha = 1.0
br-profiles-alpha-neg        profiles.0.alpha = -0.01
br-profiles-beta-neg         profiles.0.beta = -0.001
br-profiles-beta-0           profiles.0.beta = 0
br-profiles-beta-1e400       profiles.0.beta = 1e400
br-profiles-no-beta          del profiles.0.beta
br-profiles-slowdown-nan     profiles.1.slowdown = NaN
br-profiles-slowdown-inf     profiles.1.slowdown = Infinity
br-profiles-slowdown-half    profiles.1.slowdown = 0.5
br-profiles-batch-0          profiles.0.batch_sizes = [0, 50, 100, 200]
br-profiles-batch-unsorted   profiles.0.batch_sizes = [50, 25, 100, 200]
br-profiles-batch-bool       profiles.0.batch_sizes = [true, 50, 100, 200]
br-profiles-batch-str        profiles.0.batch_sizes = ["25", "50", "100", "200"]
br-profiles-steps-short      profiles.0.step_times = [0.0325, 0.055, 0.1]
br-profiles-steps-nan        profiles.0.step_times = [0.0325, NaN, 0.1, 0.19]
br-profiles-steps-neg        profiles.0.step_times = [-0.03, 0.055, 0.1, 0.19]
br-profiles-rank-dup         profiles.1.rank = 0
br-profiles-cap-0            profiles.2.cap = 0
br-profiles-cap-str          profiles.2.cap = "big"
br-profiles-reference-0      profiles.0.reference_batch = 0
br-profiles-threads-0        profiles.0.threads = 0
br-profiles-profiles-dict    profiles = {}
"""
