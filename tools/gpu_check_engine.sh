#!/usr/bin/env bash
# GPU check of issues 15, 17 and 18 (one step, one transaction; segmented step ops; one replay key; the
# per-node-state ddtree verify on the device; graph replay of mixed steps). Run it on the
# device machine from the repository root; every figure lands under $OUT:
#
#   tools/gpu_check_engine.sh [all | build | synth | tests | kernels | ncu | peer | gate | seed | draft | cluster] ...   (default:
#   all, in this order; several stages run in the order given)
#
#   build  compile the CUDA library and the Cython modules here (build.log; LUCE_NO_CUDA=1 builds
#          only the Cython modules, for a library built elsewhere and carried in luce/lib; LIB_XZ=<file>
#          unpacks such a library, xz-compressed to fit the device tool's 64 MiB upload, into luce/lib
#          first). Wheels carried in $WHEELS (default .whl: the machine has no network) are installed
#          into /tmp/luce_site first, on PYTHONPATH for every later stage.
#   synth  the synthetic files the seed and peer stages read (synthetic.log), if not in $SYNTH_DIR
#   tests  pytest -m gpu tests (gpu_tests.txt, gpu_tests.xml): kernels, the CUDA step ops over
#          [prefill][AR][tree][tree] in both GDN tree modes (bitwise AR along the accepted
#          paths), graphed engine == eager engine (mixed steps captured and replayed), the
#          exactness matrix and the 1,024-token fixture on CUDA
#   kernels  tools/bench.py over the one-row matmul cases (tune 0, 5, 6 at one row; kernels.json)
#   ncu    Nsight Compute sections (speed of light, occupancy, warp states, scheduler, memory) of
#          bench cases' kernels (NCU_CASES, NCU_KERNEL; ncu_<case>.txt); not in `all`
#   peer   decode and prefill beside llama.cpp on the same synthetic files (issues 17, 18):
#          tools/bench_decode.py --sections ar,verify,prefill (C1/C5, TTFT at $PREFILL_LENGTHS) on the
#          Qwen3.6-27B IQ4_XS, Coder-1.5B and Coder-0.5B Q4_K_M shapes (decode_<file>.json), then
#          llama-bench tg128/pp512/pp4096 on each (llamacpp.json). Needs the peers folder in the
#          checkout (PEERS, default .peers: `cp -r ../shared/peers .peers`, git-ignored, carried);
#          `all` starts its llama.cpp build first, in the background, so it builds meanwhile.
#   seed   synthetic Qwen3.6-27B IQ4_XS + its DFlash draft (tools/make_synthetic_model.py,
#          cached in $SYNTH_DIR), then tools/bench_seed_workload.py: the seed workload with an
#          oracle drafter of acceptance length 8 (wrapping the real DFlash drafter), A/B/A
#          speculation paused vs kept during prefill (established goodput in the prefill window,
#          arriving TTFT, full round, A/A drift, output digests), then SpecLA vs per-node-state
#          ddtree on the same workload (budget 22, top-k 4, tau 6: tok/s and peak staged verify
#          scratch), graph counters of every run (eager calls by reason), and the C1-C5 waves
#          (AR and SpecLA with the oracle, goodput per C, digests; issue 17) -> seed_workload.json
#   gate   issue 17's speculation gate on the make-serve pair's shapes (Coder-1.5B + 0.5B draft, synthetic):
#          plain decoding, a second plain engine (ar2: the A/A control), luce-serve's default config and
#          chain@5 under an oracle of AL 6 and 3, the arms' waves interleaved (gate.json, gate.txt;
#          GATE_WAVES, GATE_C, GATE_ARMS)
#   draft  the seed's DFlash draft pass at C1/C5 by route (draft_arm_env: luce's default, no prompt
#          rows, the draft's decode tune), interleaved twice (draft_<arm>_<round>.json; DRAFT_ARMS,
#          DRAFT_ROUNDS)
#   cluster  the wide-token kernel's cluster forms against the tile kernel, bitwise (test_wide_token_tile_kernel:
#          failed on an H200 in session 47, not reproduced there in session 48: docs/PERF.md), twice with the programmatic overlap and twice
#          without (LUCE_PDL=0): cluster_<pdl|nopdl>_<round>.txt; not in `all`
#
# summary.json gathers the test counts, the seed figures and the side-by-side table. Env: OUT (default
# /tmp/luce_gpu_check), PACK (a .tgz the results are packed into, see below), PY (default .venv/bin/python if present, else python3), SYNTH_DIR
# (default ~/.cache/luce/synthetic), TEST_TIMEOUT (s, default 1500), SEED_ARGS (extra
# bench_seed_workload.py flags, e.g. "--established-tokens 4096"), PEERS, PREFILL_LENGTHS
# (default 512,4096,12000), PEER_FILES (default: all three shapes), SEED_SECTIONS (default
# aba,modes,waves).
set -u -o pipefail
OUT=${OUT:-/tmp/luce_gpu_check}
mkdir -p "$OUT"
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
SYNTH_DIR=${SYNTH_DIR:-$HOME/.cache/luce/synthetic}
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/log.txt"; }
# PACK=<file.tgz>: the device tool returns at most 8 files of its $OUT, and this script writes ~20,
# so with OUT set elsewhere the results folder is packed into that one file every 30 s and at the
# end (a call cut by its time limit still returns what was done). A device call, e.g.:
#   PACK=$OUT/gc.tgz OUT=/tmp/gc LIB_XZ=.gl/lib.so.xz TEST_TIMEOUT=520 bash tools/gpu_check_engine.sh build tests
# (PACK first: it takes the tool's $OUT before OUT names the results folder; carry .gl and .whl).
# Each writer (the 30 s loop, the exit) packs into its own part file, so a loop's tar still running
# at exit cannot interleave with the last one; mv makes $PACK whole either way.
pack() { tar czf "$PACK.$BASHPID" -C "$OUT" . 2>/dev/null && mv "$PACK.$BASHPID" "$PACK"; }
if [ -n "${PACK:-}" ]; then
  mkdir -p "$(dirname "$PACK")"
  ( while sleep 30; do pack; done ) &
  PACKER=$!
  trap 'kill $PACKER 2>/dev/null; pack' EXIT
fi

WHEELS=${WHEELS:-.whl}
if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/luce_site "$WHEELS"/*.whl >> "$OUT/log.txt" 2>&1
  export PYTHONPATH=/tmp/luce_site${PYTHONPATH:+:$PYTHONPATH}
fi

stage_build() {
  if [ -n "${LIB_XZ:-}" ]; then
    mkdir -p luce/lib && rm -f luce/lib/libluce_cuda.json && xz -dc "$LIB_XZ" > luce/lib/libluce_cuda.so || { log "build: $LIB_XZ FAILED"; return 1; }
    # the build's record of its archs, if carried beside it (tests/tools/test_cuda_build.py reads it)
    [ -f "$(dirname "$LIB_XZ")/libluce_cuda.json" ] && cp "$(dirname "$LIB_XZ")/libluce_cuda.json" luce/lib/
    export LUCE_NO_CUDA=1
  fi
  log "build: $($PY --version 2>&1), $(command -v nvcc || echo 'no nvcc'), commit $(git rev-parse --short HEAD 2>/dev/null)${LIB_XZ:+, library $LIB_XZ}"
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
  $PY -c "import cuda.bindings" 2>/dev/null || $PY -m pip install -q "cuda-python>=12.6" >> "$OUT/build.log" 2>&1 \
    || log "build: cuda-python missing and not installable"
  if ! $PY setup.py -q build_ext --inplace -j "$(nproc)" > "$OUT/build.log" 2>&1; then
    log "build: FAILED (build.log)"; tail -40 "$OUT/build.log"; return 1
  fi
  $PY -c "from luce.ops import cuda_unavailable_reason as r; print('cuda:', r() or 'ok')" | tee -a "$OUT/log.txt"
}

synth_file() {  # preset mix path [extra args]: writes path unless it exists
  mkdir -p "$(dirname "$3")"
  [ -f "$3" ] || $PY tools/make_synthetic_model.py "$1" "$3" ${2:+--mix "$2"} "${@:4}" --workers "$(nproc)" \
    >> "$OUT/synthetic.log" 2>&1 || { log "synth: $3 FAILED"; return 1; }
}

stage_synth() {
  mkdir -p "$SYNTH_DIR"
  log "synth: writing the synthetic files"
  synth_file qwen36-27b iq4_xs "$SYNTH_DIR/qwen36-27b-iq4_xs.gguf" &&
    synth_file dflash-27b "" "$SYNTH_DIR/dflash-27b-for-iq4_xs.gguf" --target "$SYNTH_DIR/qwen36-27b-iq4_xs.gguf"
  synth_file qwen2.5-coder-1.5b q4_k_m "$SYNTH_DIR/qwen2.5-coder-1.5b-q4_k_m.gguf"
  synth_file qwen2.5-coder-0.5b q4_k_m "$SYNTH_DIR/qwen2.5-coder-0.5b-q4_k_m.gguf"
  log "synth: done"
}

stage_kernels() {
  log "kernels: tools/bench.py one-row matmul cases"
  $PY tools/bench.py --filter "${KERNEL_FILTER:-_t1\$,_t1_tune5\$,_t1_tune6\$}" --repeats 10 --no-gemm --json-out "$OUT/kernels.json" \
    > "$OUT/kernels.txt" 2>&1
  log "kernels: rc $?"
}

stage_ncu() {  # Nsight Compute on the bench cases NCU_CASES (names ending so), their kernels matching NCU_KERNEL
  # default: the DFlash C5 pass's 80-row q, out and down as the pass runs them (the decode path, tune 0 =
  # 15 for matrices of 2^24+ weights; `matmul_prefill_*_decode` cases take the prefill path's kernel), and
  # its LM head (the f16 GEMM's warpgroup 80-token tile, 768 us a pass in session 41's CUPTI)
  local case
  for case in ${NCU_CASES:-matmul_Q8_0_dq_t80_tune15 matmul_Q8_0_dout_t80_tune15 matmul_Q8_0_down_t80_tune15 \
      matmul_prefill_Q6_K_lmhead_t80_f16_tune80}; do
    log "ncu: $case"
    ncu --clock-control none --kernel-name "regex:${NCU_KERNEL:-mmq|mmp|mmw}" --launch-count 2 --section SpeedOfLight --section Occupancy \
      --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      --section ComputeWorkloadAnalysis --section InstructionStats \
      $PY tools/bench.py --filter "$case\$" --repeats 1 --no-gemm > "$OUT/ncu_$case.txt" 2>&1 || log "ncu: rc $?"
  done
}

stage_tests() {
  log "tests: pytest -m gpu tests"
  timeout "${TEST_TIMEOUT:-1500}" $PY -m pytest -q -m gpu tests -p no:cacheprovider -rfE \
    --junitxml="$OUT/gpu_tests.xml" > "$OUT/gpu_tests.txt" 2>&1
  log "tests: rc $? ($(tail -1 "$OUT/gpu_tests.txt"))"
}

stage_seed() {
  mkdir -p "$SYNTH_DIR"
  local target="$SYNTH_DIR/qwen36-27b-iq4_xs.gguf" draft="$SYNTH_DIR/dflash-27b-for-iq4_xs.gguf"
  synth_file qwen36-27b iq4_xs "$target" && synth_file dflash-27b "" "$draft" --target "$target" || return 1
  log "seed: bench_seed_workload.py ${SEED_ARGS:-}"
  # shellcheck disable=SC2086
  $PY tools/bench_seed_workload.py "$target" --draft "$draft" --backend cuda --json "$OUT/seed_workload.json" \
    --sections "${SEED_SECTIONS:-aba,modes,waves}" ${SEED_ARGS:-} > "$OUT/seed_workload.txt" 2>&1
  log "seed: rc $? ($(tail -3 "$OUT/seed_workload.txt" | tr '\n' ' '))"
}

stage_peer() {
  local peers=${PEERS:-.peers} files=() f name
  [ -f "$peers/llamacpp.sh" ] || { log "peer: no $peers/llamacpp.sh (cp -r ../shared/peers $peers)"; return 1; }
  grep -q LLAMA_BUILD_OK /tmp/llamacpp-peer/build.log 2>/dev/null || pgrep -f llamacpp-peer/build.sh >/dev/null \
    || bash "$peers/llamacpp.sh" build >> "$OUT/log.txt"
  mkdir -p "$SYNTH_DIR"
  for f in ${PEER_FILES:-qwen36-27b:iq4_xs qwen2.5-coder-1.5b:q4_k_m qwen2.5-coder-0.5b:q4_k_m}; do
    name="$SYNTH_DIR/${f%%:*}-${f##*:}.gguf"
    synth_file "${f%%:*}" "${f##*:}" "$name" || continue
    files+=("$name")
  done
  for f in "${files[@]}"; do
    name=$(basename "$f" .gguf)
    log "peer: luce bench_decode $name"
    $PY tools/bench_decode.py "$f" --backend cuda --sections ar,verify,prefill --concurrency 1,5 --steps 12 --warmup 3 \
      --prefill-lengths "${PREFILL_LENGTHS:-512,4096,12000}" --json "$OUT/decode_$name.json" \
      > "$OUT/decode_$name.txt" 2>&1 || log "peer: bench_decode $name rc $?"
  done
  log "peer: llama-bench tg128 pp512 pp4096, passes of W tokens at 1,024"
  LLAMA_REPS=${LLAMA_REPS:-3} LLAMA_TESTS="${LLAMA_TESTS:-tg pp widths}" LLAMA_JSON="$OUT/llamacpp.json" bash "$peers/llamacpp.sh" bench \
    "${files[@]}" > "$OUT/llamacpp.txt" 2>&1
  log "peer: llama-bench rc $?"
}

stage_gate() {  # issue 17's gate: luce-serve's default speculation against plain decoding, the make-serve pair
  local target="$SYNTH_DIR/qwen2.5-coder-1.5b-q4_k_m.gguf" draft="$SYNTH_DIR/qwen2.5-coder-0.5b-q4_k_m.gguf"
  mkdir -p "$SYNTH_DIR"
  synth_file qwen2.5-coder-1.5b q4_k_m "$target" && synth_file qwen2.5-coder-0.5b q4_k_m "$draft" || return 1
  log "gate: bench_seed_workload.py --sections gate (interleaved waves, AL 6 and 3, C ${GATE_C:-1}, arms ${GATE_ARMS:-ar,ar2,default,chain@5})"
  $PY tools/bench_seed_workload.py "$target" --draft "$draft" --backend cuda --sections gate --wave-prompt-len 128 \
    --wave-tokens 128 --waves "${GATE_WAVES:-6}" --gate-al 6,3 --concurrency "${GATE_C:-1}" --arms "${GATE_ARMS:-ar,ar2,default,chain@5}" \
    --json "$OUT/gate.json" > "$OUT/gate.txt" 2>&1
  log "gate: rc $? ($(grep '^gate' "$OUT/gate.txt" | tr '\n' ' '))"
}

stage_cluster() {
  local pdl round
  nvidia-smi -L >> "$OUT/log.txt" 2>&1
  for pdl in pdl nopdl; do
    for round in 1 2; do
      log "cluster: test_wide_token_tile_kernel, $pdl, round $round"
      env $([ $pdl = nopdl ] && echo LUCE_PDL=0) timeout 300 $PY -m pytest -q -m gpu tests/kernels/test_matmul.py \
        -k wide_token -p no:cacheprovider -rfE > "$OUT/cluster_${pdl}_$round.txt" 2>&1
      log "cluster: rc $? ($(tail -1 "$OUT/cluster_${pdl}_$round.txt"))"
    done
  done
}

stage_draft() {  # the DFlash pass by route: interleaved twice, C1 and C5 (draft_<arm>_<round>.json)
  local target="$SYNTH_DIR/qwen36-27b-iq4_xs.gguf" draft="$SYNTH_DIR/dflash-27b-for-iq4_xs.gguf" round arm
  synth_file qwen36-27b iq4_xs "$target" && synth_file dflash-27b "" "$draft" --target "$target" || return 1
  for round in $(seq "${DRAFT_ROUNDS:-2}"); do
    for arm in ${DRAFT_ARMS:-default before81}; do
      log "draft: DFlash draft pass, $arm (round $round)"
      env $(draft_arm_env $arm) $PY tools/bench_decode.py "$target" --draft "$draft" --backend cuda --sections draft \
        --concurrency 1,5 --steps 12 --warmup 3 --json "$OUT/draft_${arm}_$round.json" > "$OUT/draft_${arm}_$round.txt" 2>&1 \
        || log "draft: pass rc $?"
    done
  done
}

draft_arm_env() {  # default: luce's routing (tune 81, the prompt GEMM's split k, for the own calls n >= 4096
  # of a pass of 32+ rows); decode: no prompt rows; before81: session 42's default (n >= 8192 on the
  # prompt GEMM's one-chain tiles); split81kv: k and v on tune 81 too; split81all: every pass (C1's 16 rows);
  # tune13 / tune14 / tune15: the draft's decode-family calls other than k / v on that tune (q, out and
  # down have 2^24+ weights: tune 0 already takes 15 for them, so tune15 is the default there)
  case $1 in
    default) ;;
    decode) echo LUCE_DRAFT_PROMPT_GEMM=0 ;;
    tune13|tune14|tune15) echo LUCE_DRAFT_DECODE_TUNE=${1#tune} ;;
    before81) echo LUCE_DRAFT_PROMPT_GEMM_MIN_N=8192 LUCE_DRAFT_PROMPT_TUNE=0 ;;
    split81kv) echo LUCE_DRAFT_PROMPT_GEMM_MIN_N=0 ;;
    split81all) echo LUCE_DRAFT_PROMPT_GEMM=1 ;;
  esac
}

summary() {
  $PY - "$OUT" <<'PYEOF'
import json, sys, pathlib, xml.etree.ElementTree as ET
out = pathlib.Path(sys.argv[1])
s = {}
xml = out / "gpu_tests.xml"
if xml.exists():
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    s["gpu_tests"] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    s["gpu_tests"]["failed"] = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
                                if c.find("failure") is not None or c.find("error") is not None]
seed = out / "seed_workload.json"
if seed.exists():
    r = json.loads(seed.read_text())
    aba = r.get("aba", {})
    s["seed_aba"] = {"summary": aba.get("summary"),
                     **{arm: {k: aba[arm][k] for k in ("established_goodput_tok_s", "established_goodput_before_tok_s",
                                                      "arriving_ttft_s", "round_s", "tok_s", "digest", "graphs",
                                                      "established_done_before_window_end", "acceptance_length")}
                        for arm in ("warmup", "A", "B", "A2") if arm in aba}}
    modes = r.get("modes", {})
    s["specla_vs_ddtree"] = {m: {k: modes[m][k] for k in ("tok_s", "established_goodput_tok_s", "peak_staged_bytes",
                                                           "matches_plain", "graphs")}
                             for m in ("specla", "ddtree") if m in modes}
    s["specla_vs_ddtree"]["specla_over_ddtree_tok_s"] = modes.get("specla_over_ddtree_tok_s")
    if "waves" in r:
        s["waves"] = r["waves"].get("summary")
peer = json.loads((out / "llamacpp.json").read_text()) if (out / "llamacpp.json").exists() else []
side = {}
for path in sorted(out.glob("decode_*.json")):
    r, name = json.loads(path.read_text()), path.stem[len("decode_"):]
    theirs = {row["test"]: row["tok_s"] for row in peer if row["file"] == name + ".gguf"}
    mine = {f"C{a['concurrency']}": a.get("tok_s") for a in r.get("ar", [])}
    mine.update({f"pp{p['prompt_tokens']}": p.get("tok_s") for p in r.get("prefill", [])})
    pairs = {"C1 / tg128": ("C1", "tg128"), "pp512": ("pp512", "pp512"), "pp4096": ("pp4096", "pp4096")}
    side[name] = {"luce": mine, "llama.cpp": theirs,
                  "ratio": {k: mine[a] / theirs[b] for k, (a, b) in pairs.items() if mine.get(a) and theirs.get(b)},
                  "launches_per_step": next((a.get("launches") for a in r.get("ar", []) if a.get("concurrency") == 1), None)}
if side:
    s["beside_llamacpp"] = side
kern = out / "kernels.json"
if kern.exists():
    s["one_row_matmul"] = {r["name"]: (round(r["time_us"], 2), round(r["pct_bw"], 1)) if "time_us" in r else r.get("error")
                           for r in json.loads(kern.read_text()).get("cases", [])}
for path in sorted(out.glob("draft_*.json")):
    s[f"dflash_pass_ms_{path.stem[6:]}"] = {f"C{r['concurrency']}": r.get("pass_ms")
                                           for r in json.loads(path.read_text()).get("draft_pass", [])}
(out / "summary.json").write_text(json.dumps(s, indent=1, default=str))
print(json.dumps(s, indent=1, default=str)[:4000])
PYEOF
}

for STAGE in "${@:-all}"; do
case "$STAGE" in
  build) stage_build || break ;;
  synth) stage_synth ;;
  tests) stage_tests ;;
  kernels) stage_kernels ;;
  ncu) stage_ncu ;;
  draft) stage_draft ;;
  cluster) stage_cluster ;;
  seed) stage_seed ;;
  peer) stage_peer ;;
  gate) stage_gate ;;
  all) [ -f "${PEERS:-.peers}/llamacpp.sh" ] && bash "${PEERS:-.peers}/llamacpp.sh" build >> "$OUT/log.txt"
       stage_synth & synth=$!   # on the CPU, beside the GPU tests
       stage_build && { stage_tests; stage_kernels; wait $synth; stage_peer; stage_gate; stage_seed; stage_draft; } ;;
  *) echo "usage: $0 [all | build | synth | tests | kernels | ncu | peer | gate | seed | draft | cluster] ..."; exit 2 ;;
esac
done
summary
