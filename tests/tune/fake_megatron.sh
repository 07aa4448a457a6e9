#!/bin/sh
# A stand-in for a Megatron-LM launch in the tune CLI test: it reads the parallel sizes from the flags lcplan tune
# passes ({megatron_flags}) and prints Megatron-LM's iteration lines with a step time made up from them (EP and CP
# cost 40 and 90 ms per doubling), or a CUDA out-of-memory error for EP 1 with CP 1.
cp=1; ep=1; gbs=0
while [ $# -gt 0 ]; do
  case "$1" in
    --context-parallel-size) cp=$2; shift ;;
    --expert-model-parallel-size) ep=$2; shift ;;
    --global-batch-size) gbs=$2; shift ;;
  esac
  shift
done
if [ "$cp" = 1 ] && [ "$ep" = 1 ]; then
  echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"
  exit 1
fi
ms=$((2000 + 40 * ep + 90 * cp))
for it in 10 20 30 40; do
  echo " [2026-01-01 10:00:00] iteration       $it/     100 | consumed samples:        640 | elapsed time per iteration (ms): $ms.0 | throughput per GPU (TFLOP/s/GPU): 100.0 | learning rate: 1.0E-04 | global batch size: $gbs | lm loss: 6.0E+00 | loss scale: 1.0 | grad norm: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |"
done
