# Shared helpers of the multi-rank tests (bats-core >= 1.5): where comm_check
# and the launchers are, private Slurm clusters for one .bats file, and
# waiting for ranks.  Load with `load common` from a .bats file in
# tests/cluster/.  The harness (make check) exports top_srcdir and
# top_builddir and puts $top_builddir/bin first on PATH; run by hand, the
# defaults assume the source tree is the build tree.
#
# Every test that needs a tool it cannot find, or root for Slurm, skips and
# says why.  A cluster that should start but does not is a failure.
# shellcheck shell=bash disable=SC2034,SC2154 # bats sets and reads these

: "${top_srcdir:=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
export top_srcdir top_builddir

# fox_corpus LINES FILE: the training text of the program tests.
# shellcheck source=../corpus.bash
source "$BATS_TEST_DIRNAME/../corpus.bash"
# slurmctld, slurmd and munged live in sbin, which a non-login root shell
# may lack.
case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH=$PATH:/usr/sbin:/sbin ;; esac
export PATH

CLUSTER_SRC=$top_srcdir/tests/cluster
COMM_CHECK=$top_builddir/tests/cluster/comm_check
CKPT_CLOSE=$top_builddir/tests/cluster/ckpt_close
# libpmix, libevent and hwloc keep a few allocations to exit; every rank
# would fail LeakSanitizer without these (pmix-slurm.md gotcha 12).
# print_suppressions=0: the statistics of what was suppressed would fill
# stderr, which the tests check.
LSAN_OPTIONS=suppressions=$CLUSTER_SRC/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}
export LSAN_OPTIONS
export OMP_WAIT_POLICY=PASSIVE
# Short enough for tests, long enough for two busy cores: the deadline of
# comm_check's collectives, and the outer limit of every launch.
CHECK_TIMEOUT=30
LAUNCH_TIMEOUT=120
# A PMIx fence across nodes waits this long for a dead rank (mpi.conf
# PMIxTimeout; the default is 300 s).
export FLOW_SLURM_PMIX_TIMEOUT=15
# Fail instead of installing packages in the middle of a test run.
export FLOW_SLURM_NO_INSTALL=1

# The summary line comm_check's rank 0 prints for $1 ranks on $2 nodes over
# transport $3 with nothing wrong, as an extended regular expression.
summary_re() {
	echo "^comm_check: $1 ranks on $2 nodes, transport $3: [1-9][0-9]* checks, 0 wrong\$"
}

# The output of the last `run` must be exactly one summary line matching
# summary_re "$@".
assert_summary() {
	local re
	re=$(summary_re "$@")
	if [ "${#lines[@]}" -ne 1 ] || ! [[ ${lines[0]} =~ $re ]]; then
		echo "expected one line matching '$re', got:" >&2
		printf '%s\n' "$output" >&2
		return 1
	fi
}

# ---- what a test needs ---------------------------------------------------------

need_comm_check() {
	[ -x "$COMM_CHECK" ] ||
		skip "comm_check is not built (make tests/cluster/comm_check)"
	need_pmix_build
}

# A build without PMIx (no libpmix-dev at configure time) has one-rank
# worlds only: no launcher, no multi-rank test.
need_pmix_build() {
	flow-bench --version | grep -q 'pmix: yes' ||
		skip "this build has no PMIx (install libpmix-dev and reconfigure)"
}

# need_cmd NAME...: skip unless every NAME is on PATH.
need_cmd() {
	local c
	for c; do
		command -v "$c" >/dev/null 2>&1 || skip "$c not found"
	done
}

# Why Slurm cannot run here, or nothing when it can.
slurm_missing() {
	local c
	if [ "$(id -u)" != 0 ]; then
		echo "not root: the test Slurm cluster runs its daemons as root"
		return
	fi
	for c in srun sbatch scontrol sinfo munged mungekey slurmctld slurmd; do
		command -v "$c" >/dev/null 2>&1 || {
			echo "$c not found"
			return
		}
	done
	# mpi/pmix dlopens the unversioned libpmix.so of libpmix-dev
	# (pmix-slurm.md gotcha 6).
	if ! ls /usr/lib/*/pmix2/lib/libpmix.so >/dev/null 2>&1; then
		echo "no pmix2/lib/libpmix.so for Slurm's mpi/pmix (libpmix-dev)"
	fi
}

need_mpirun() {
	need_cmd mpirun
	# OpenMPI refuses root without these (pmix-slurm.md section 5).
	export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

# ---- private Slurm clusters ------------------------------------------------------
#
# slurm_up NAME PORT [slurm-up.sh options]: in setup_file, start a cluster
# on ctld port PORT under a fresh short state dir (sockets under it must fit
# in 107 bytes: pmix-slurm.md gotcha 15) and export NAME_STATE, or NAME_SKIP
# (why it cannot run here) or NAME_ERROR (it should have started).  Each
# .bats file uses its own ports and subnet, so files can run in parallel
# and beside a developer's cluster (6817, 6827).
slurm_up() {
	local name=$1 port=$2 state why log
	shift 2
	why=$(slurm_missing)
	if [ -n "$why" ]; then
		export "${name}_SKIP=$why"
		return 0
	fi
	state=$(mktemp -d "/tmp/flow-t$port.XXXXXX")
	export "${name}_STATE=$state"
	log=$BATS_FILE_TMPDIR/slurm-up-$port.log
	if ! "$CLUSTER_SRC/slurm-up.sh" -p "$port" "$@" "$state" >"$log" 2>&1; then
		export "${name}_ERROR=slurm-up.sh -p $port $* failed: $(tail -n 5 "$log" | tr '\n' ' ')"
	fi
}

# slurm_down NAME: in teardown_file, stop NAME's cluster and remove its
# state (FLOW_TEST_KEEP=1 keeps it, logs included).
slurm_down() {
	local state_var=${1}_STATE
	local state=${!state_var:-}
	[ -n "$state" ] || return 0
	"$CLUSTER_SRC/slurm-down.sh" "$state" >/dev/null 2>&1
	if [ "${FLOW_TEST_KEEP:-0}" = 1 ]; then
		echo "# cluster state kept in $state" >&3
	else
		rm -rf "$state"
	fi
}

# use_slurm NAME: in a test, skip or fail unless NAME's cluster is up, and
# point the Slurm commands at it.
use_slurm() {
	local skip_var=${1}_SKIP error_var=${1}_ERROR state_var=${1}_STATE
	[ -z "${!skip_var:-}" ] || skip "${!skip_var}"
	if [ -n "${!error_var:-}" ]; then
		echo "${!error_var}" >&2
		return 1
	fi
	export SLURM_CONF=${!state_var}/slurm.conf
}

# sbatch_wait JOBID SECONDS: poll the job until it ends (sbatch --wait polls
# every 2 s and more: gotcha 9); prints its JobState and ExitCode as
# "STATE CODE", e.g. "COMPLETED 0:0".  Fails when it is still running.
sbatch_wait() {
	local id=$1 limit=$2 info state code i
	for ((i = 0; i < limit * 10; i++)); do
		info=$(scontrol show job "$id" 2>/dev/null)
		state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$info")
		code=$(sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p' <<<"$info")
		case $state in
		PENDING | CONFIGURING | RUNNING | COMPLETING | '') sleep 0.1 ;;
		*)
			echo "$state $code"
			return 0
			;;
		esac
	done
	echo "job $id still ${state:-unknown} after ${limit}s" >&2
	scancel "$id" 2>/dev/null
	return 1
}

# ---- ranks and processes -----------------------------------------------------------

# wait_for_files N DIR SECONDS: wait until DIR holds pid.0 .. pid.(N-1).
wait_for_files() {
	local n=$1 dir=$2 limit=$3 i r missing
	for ((i = 0; i < limit * 20; i++)); do
		missing=
		for ((r = 0; r < n; r++)); do
			[ -e "$dir/pid.$r" ] || missing="$missing $r"
		done
		[ -z "$missing" ] && return 0
		sleep 0.05
	done
	echo "no pid file after ${limit}s from rank(s)$missing" >&2
	return 1
}

# pid_of DIR RANK: the pid that rank RANK wrote.
pid_of() {
	read -r pid _ <"$1/pid.$2" && echo "$pid"
}

# background JOB...: remember background jobs (launches under `timeout`,
# or launchers) for stop_background.
BG_JOBS=()
background() {
	BG_JOBS+=("$@")
}

# stop_background: in teardown, end what a failed test left running; the
# launchers pass SIGTERM on to their ranks (timeout to its command).
stop_background() {
	local pid running
	# Only jobs this shell has not waited for: the PID of one that ended
	# and was waited for may belong to someone else by now.
	running=" $(jobs -p | tr '\n' ' ') "
	for pid in "${BG_JOBS[@]}"; do
		case $running in *" $pid "*) kill -TERM "$pid" 2>/dev/null || true ;; esac
	done
	BG_JOBS=()
}

# wait_pid PID SECONDS: wait for background job PID (a child of this
# shell) and set $status to its exit status; SIGKILL and fail if it takes
# longer than SECONDS.
wait_pid() {
	local pid=$1 limit=$2 i
	for ((i = 0; i < limit * 20; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.05
	done
	if kill -0 "$pid" 2>/dev/null; then
		echo "process $pid still running after ${limit}s; killing it" >&2
		kill -KILL "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
		return 1
	fi
	status=0
	wait "$pid" || status=$?
}

# assert_gone PID...: none of the processes may be left.
assert_gone() {
	local pid
	for pid; do
		if kill -0 "$pid" 2>/dev/null &&
			! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null; then
			echo "process $pid is still running" >&2
			return 1
		fi
	done
}

# assert_lines FILE RE: every line of FILE matches RE, and there is one.
assert_lines() {
	if ! [ -s "$1" ] || grep -qvE "$2" "$1"; then
		echo "expected only lines matching '$2' in $1, got:" >&2
		cat "$1" >&2
		return 1
	fi
}

# every_line_matches RE TEXT: each line of TEXT (there may be none)
# matches the extended regular expression RE.
every_line_matches() {
	local line
	[ -n "$2" ] || return 0
	while IFS= read -r line; do
		if ! [[ $line =~ $1 ]]; then
			echo "unexpected line: $line" >&2
			return 1
		fi
	done <<<"$2"
}

# now_ms: monotonic enough for test deadlines.
now_ms() {
	echo $(($(date +%s%N) / 1000000))
}
