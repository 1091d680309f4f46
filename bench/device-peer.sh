#!/usr/bin/env bash
# Strata beside llama.cpp in one device call, on the same synthetic files: the figures bench/RESULTS.md quotes as
# ratios. Here, first: ../shared/peer/prepare.sh && scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/
# There (carry .peer; the machine goes back 30 s after a call ends, so start it in the background and poll until
# /tmp/peer/main.log says ALL_DONE):
#   setsid nohup bash bench/device-peer.sh > /dev/null 2>&1 < /dev/null &
# llama.cpp (build 11434, CUDA sm_90) builds beside Strata; then per file: llama-bench all in VRAM and in its best
# configuration at about 12 GiB (-ncmoe N -lm none, peak GPU memory measured), and strata bench resident and at
# --vram-budget 12G (4096- and 8192-token chunks), with the A/B rows of the streamed schedule, the LFU cache and
# next-layer prefetch, and four sequences decoding together against llama-batched-bench. Every command's output is in
# /tmp/peer; main.log holds the table rows. Takes ~20 minutes, more than one device call may run (600 s):
# bench/device-round.sh is the one-call subset.
L=/tmp/peer; mkdir -p $L
exec > $L/main.log 2>&1
source .peer/device.sh env; source scripts/device-env.sh
(bash .peer/device.sh llama > $L/llama-build.log 2>&1) &
CM="-DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_CUDA_ARCHS=90 -DCMAKE_PREFIX_PATH=/tmp/deps/usr
    -DPKG_CONFIG_EXECUTABLE=/tmp/deps/usr/bin/pkgconf -DGTest_DIR=/tmp/deps/usr/lib/x86_64-linux-gnu/cmake/GTest
    -DSTRATA_PYTHON=/nonexistent -DSTRATA_TESTS=OFF"
cmake -S . -B /tmp/strata $CM > $L/cfg.log 2>&1 && cmake --build /tmp/strata -j8 --target strata > $L/build.log 2>&1
echo "strata build rc=$?"
wait
tail -1 $L/llama-build.log
S=/tmp/strata/bin/strata; LB=/tmp/llama.cpp/build/bin/llama-bench
[ -x $S ] && [ -x $LB ] || { echo "a build failed"; echo ALL_DONE; exit 1; }
strata() { echo "== $(env | grep '^STRATA_' | tr '\n' ' ')strata $*"; $S bench "$@" > $L/s.txt 2> $L/s.err
  grep -E "^\| synth|next-layer prediction" $L/s.txt; cat $L/s.txt >> $L/strata-all.txt; }
llama() { echo "== llama-bench $*"; bash .peer/device.sh peak $LB "$@" > $L/l.txt 2>&1; grep -E "^\| |peak" $L/l.txt | grep -v -- "---"; cat $L/l.txt >> $L/llama-all.txt; }

$S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o /tmp/q30.gguf
llama -m /tmp/q30.gguf -ngl 99 -fa 1 -t 16 -ub 4096 -b 4096 -p 512,4096 -n 128 -r 2
strata -m /tmp/q30.gguf -p 512,4096 --chunk 4096 -n 128 -r 2
llama -m /tmp/q30.gguf -ngl 99 -ncmoe 26 -lm none -fa 1 -t 16 -ub 4096 -b 4096 -p 512,4096 -n 64 -r 2
strata -m /tmp/q30.gguf -p 512,4096 --chunk 4096 -n 64 -r 2 --vram-budget 12G
strata -m /tmp/q30.gguf -p 16 -n 64 -r 2 --vram-budget 12G --routing uniform
strata -m /tmp/q30.gguf -p 16 -n 64 -r 2 --vram-budget 12G --routing uniform --expert-cache-policy lfu
STRATA_DECODE_PREFETCH=1 strata -m /tmp/q30.gguf -p 16 -n 64 -r 2 --vram-budget 12G --routing uniform
rm -f /tmp/q30.gguf  # the disk holds one of the two files at a time

$S synth --preset qwen3-next-80b-a3b --type Q4_K --dense-type Q8_0 -o /tmp/n80.gguf
llama -m /tmp/n80.gguf -ngl 99 -fa 1 -t 16 -ub 4096 -b 4096 -p 512,4096 -n 64 -r 2
strata -m /tmp/n80.gguf -p 512,4096 --chunk 4096 -n 64 -r 2
llama -m /tmp/n80.gguf -ngl 99 -ncmoe 40 -lm none -fa 1 -t 16 -ub 4096 -b 4096 -p 4096,16384 -n 32 -r 1
strata -m /tmp/n80.gguf -p 4096,16384 --chunk 4096 -n 32 -r 1 --vram-budget 12G
strata -m /tmp/n80.gguf -p 16384 --chunk 8192 -n 1 -r 1 --vram-budget 12G
STRATA_PREFILL_STREAM_AHEAD=0 strata -m /tmp/n80.gguf -p 16384 --chunk 8192 -n 1 -r 1 --vram-budget 12G
strata -m /tmp/n80.gguf -p 16 -n 32 -r 2 --vram-budget 12G --routing uniform
strata -m /tmp/n80.gguf -p 16 -n 32 -r 2 --vram-budget 12G --routing uniform --expert-cache-policy lfu
STRATA_DECODE_PREFETCH=1 strata -m /tmp/n80.gguf -p 16 -n 32 -r 2 --vram-budget 12G --routing uniform
# four sequences decoding together at 12 GiB (aggregate t/s), against llama.cpp's batched bench at -ncmoe 40
strata -m /tmp/n80.gguf -p 16 -n 32 -r 2 --vram-budget 12G --routing uniform --parallel 4
echo "== llama-batched-bench -ncmoe 40 -npl 4"; bash .peer/device.sh peak /tmp/llama.cpp/build/bin/llama-batched-bench \
  -m /tmp/n80.gguf -ngl 99 -ncmoe 40 -lm none -fa 1 -t 16 -c 4096 -b 2048 -ub 512 -npp 16 -ntg 32 -npl 1,4 > $L/bb.txt 2>&1
grep -E "^\||peak" $L/bb.txt
echo ALL_DONE
