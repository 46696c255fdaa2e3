#!/bin/bash
# sbatch-gpt2-2x8gpu.sh: train GPT-2 (124M) on 2 nodes x 8 GPUs, one rank
# per GPU, data parallel over all 16 with NCCL.  The dataset is
# sharded once (flow-shard), the plan written and checked against the job's
# size (flow-plan), then every task runs flow-train on its GPU.
# A starting point to adapt: add --partition/--account as your site wants,
# and set --cpus-per-task to the node's cores / 8.
#
#   sbatch examples/sbatch-gpt2-2x8gpu.sh                 # 2 x 8, as below
#   DATA='fineweb_train_*.bin' sbatch examples/sbatch-gpt2-2x8gpu.sh
#   NODES=4 GPUS_PER_NODE=4 examples/sbatch-gpt2-2x8gpu.sh --partition=gpu
#
# Run from a shell outside any job (the last line), the script submits
# itself with the shape the environment gives:
#   sbatch --nodes=$NODES --ntasks-per-node=$TASKS_PER_NODE
#          --gpus-per-node=$GPUS_PER_NODE [ARGS...] this-script
# NODES defaults to 2, GPUS_PER_NODE to 8 and TASKS_PER_NODE to
# GPUS_PER_NODE (one rank per GPU); ARGS are more sbatch options, and they
# win over everything before them.  GPUS_PER_NODE=0 asks Slurm for no GPU
# at all (--gpus-per-node=0; set TASKS_PER_NODE then), for a cluster that
# does not manage its GPUs as gres, where every task sees all of the node's
# GPUs anyway, or to try the script where there is no GPU: flow-train then
# refuses with one line.  Inside a job (sbatch, salloc) the shape is the
# job's own, whatever the environment says.
#
# Which GPU a rank takes: every task of a node sees all of the node's GPUs
# (the step gets all of the job's; nothing below asks srun for GPUs per
# task), and flow-train takes the one of its local rank, so NCCL's
# peer-to-peer paths (NVLink) between the node's GPUs stay usable.
# srun --gpus-per-task=1 also works (each task then sees one GPU, its
# ordinal 0) but hides the GPUs from each other's processes.  More tasks
# than GPUs on a node is refused, naming the rank and the node.  The whole
# rule is in lib/flow/gpu_binding.h, with FLOW_CUDA_DEVICE, the override
# for runs of one rank (unset below: copied into every task it would put
# all ranks of a node on one GPU).
#
# srun -K (--kill-on-bad-exit): when one rank fails, Slurm ends the others
# at once instead of leaving them in a collective until --comm-timeout
# (train-1node.sbatch says why that matters across nodes).  Re-submitting
# the script (or sbatch --requeue after a time limit) continues from the
# last committed checkpoint in $OUT/ckpt.
#
#SBATCH --job-name=flow-gpt2
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
#SBATCH --output=flow-gpt2-%j.out
set -euo pipefail

# ---- submitting ----------------------------------------------------------------
if [ -z "${SLURM_JOB_ID:-}" ]; then
	gpus=${GPUS_PER_NODE:-8}
	tasks=${TASKS_PER_NODE:-$gpus}
	if [ "$tasks" -lt 1 ]; then
		echo "sbatch-gpt2-2x8gpu.sh: GPUS_PER_NODE=0 needs TASKS_PER_NODE (ranks per node)" >&2
		exit 2
	fi
	exec sbatch --nodes="${NODES:-2}" --ntasks-per-node="$tasks" \
		--gpus-per-node="$gpus" --export=ALL "$@" "${BASH_SOURCE[0]}"
fi

# ---- in the job ------------------------------------------------------------------
if [ $# -gt 0 ]; then
	echo "sbatch-gpt2-2x8gpu.sh: arguments are sbatch options, for a submission from outside a job: $*" >&2
	exit 2
fi
# Settings, from the environment sbatch passes on (set MODEL in the
# environment, not in --export=NAME=VALUE: a model spec holds commas).
FLOW_BIN=${FLOW_BIN:-}          # directory of the flow programs; empty: PATH
DATA=${DATA:-corpus.txt}        # text or llm.c/.npy token files, space-separated
OUT=${OUT:-flow-gpt2}           # dataset, plan, checkpoints and train.tsv
MODEL=${MODEL:-gpt2-124m}
VOCAB=${VOCAB:-50257}           # token files do not record it (flow-shard(1))
VAL_TOKENS=${VAL_TOKENS:-1M}    # the first tokens of DATA, held out
SEQ_LEN=${SEQ_LEN:-1024}
# 16 ranks x 16 sequences x 1024 tokens x 2 micro-batches = 512K tokens
# per step.  flow-plan --check below prints the memory a rank needs (29 GB
# with these, as it counts); on smaller GPUs lower BATCH_PER_GPU and raise
# GRAD_ACCUM by the same factor.
BATCH_PER_GPU=${BATCH_PER_GPU:-16} # sequences per rank per micro-batch
GRAD_ACCUM=${GRAD_ACCUM:-2}     # micro-batches per step
ZERO=${ZERO:-0}                 # 1: shard AdamW's state over the ranks
PRECISION=${PRECISION:-bf16}    # bf16 GEMMs on the tensor cores, or fp32
STEPS=${STEPS:-5000}
LR=${LR:-6e-4}
WARMUP=${WARMUP:-$((STEPS / 20))}
EVAL_EVERY=${EVAL_EVERY:-250}
CKPT_EVERY=${CKPT_EVERY:-500}
COMM_TIMEOUT=${COMM_TIMEOUT:-300} # seconds a rank waits for a peer

# NCCL: only what helps a first run.  WARN prints NCCL's warnings and
# errors, and nothing when all is well; INFO shows the network and
# transports it chose (look once: NET/IB for InfiniBand, NET/Socket
# without).  InfiniBand/RoCE is found by NCCL itself: NCCL_IB_HCA is for
# excluding ports, not for enabling them.
# NCCL_SOCKET_IFNAME is the knob when NCCL picks the wrong network for its
# bootstrap (and for its socket transport without InfiniBand), e.g. ib0 or
# ^docker,lo; it is left as your environment has it.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
unset FLOW_CUDA_DEVICE
# Host threads per rank (data loading, host-side work).
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}

bin=${FLOW_BIN:+$FLOW_BIN/}
ranks=$SLURM_NTASKS
batch=$((ranks * BATCH_PER_GPU))
echo "# job $SLURM_JOB_ID: $ranks ranks, nodes $SLURM_JOB_NODELIST," \
	"GPUs per node: ${SLURM_GPUS_PER_NODE:-none}" >&2
mkdir -p "$OUT"

# 0. What each task sees: one line per rank in the job's output, the first
# thing to read when a rank cannot find its GPU.
# shellcheck disable=SC2016 # expanded by each task's shell
show='echo "# task $SLURM_PROCID (local $SLURM_LOCALID) on $SLURMD_NODENAME: CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"'
srun --mpi=none -K bash -c "$show" >&2

# 1. The dataset, once: flow-shard is one process, so it runs here in the
# batch step.  It creates the directory only when complete, so a dataset
# that exists is a whole one.
if [ ! -e "$OUT/data/manifest" ]; then
	# shellcheck disable=SC2086 # DATA is a list of files
	"${bin}flow-shard" -o "$OUT/data" --vocab "$VOCAB" \
		--val-tokens "$VAL_TOKENS" $DATA
fi

# 2. The plan: data parallel over every rank, checked against the job's
# size before any rank starts.
# The plan also says where it trains: on the GPUs, in $PRECISION.
"${bin}flow-plan" --model "$MODEL" --mesh "$ranks" --axes dp \
	--batch "$batch" --seq-len "$SEQ_LEN" --grad-accum "$GRAD_ACCUM" \
	--zero "$ZERO" --device cuda --precision "$PRECISION" -o "$OUT/train.plan"
"${bin}flow-plan" --check "$OUT/train.plan" --world "$ranks" >&2

# 3. Every task trains on its GPU; a committed checkpoint is resumed.
resume=()
if ls "$OUT"/ckpt/step-*/manifest >/dev/null 2>&1; then
	resume=(--resume latest)
fi
srun --mpi=pmix -K "${bin}flow-train" --plan "$OUT/train.plan" \
	--data "$OUT/data" --comm nccl \
	--steps "$STEPS" --lr "$LR" --warmup "$WARMUP" \
	--eval-every "$EVAL_EVERY" --ckpt-dir "$OUT/ckpt" \
	--ckpt-every "$CKPT_EVERY" --comm-timeout "$COMM_TIMEOUT" \
	"${resume[@]}" >>"$OUT/train.tsv"

# The curve: the val rows (step, loss).
awk -F'\t' '$2 == "val" { print $1 "\t" $3 }' "$OUT/train.tsv" >&2
