# bg_wait COMMAND...: run COMMAND in the background and wait for it, its
# pid in $child meanwhile; returns its status.  For tests/gpu/run.sh,
# tests/gpu/train.sh and bench/gpu-train-vs-torch.sh (POSIX sh too): a
# shell runs a trap only once its foreground child has ended, and a
# command under timeout(1) is in a process group of its own that a signal
# to ours does not reach, so a script that waits this way answers a TERM
# at once and its trap can pass it on to "$child".  Fds 8 and 9 (run.sh's
# own stdout and stderr, for its trap) are not passed on.
# shellcheck shell=sh
child=
bg_wait() {
	bg_rc=0
	"$@" 8>&- 9>&- &
	child=$!
	wait "$child" || bg_rc=$?
	child=
	return "$bg_rc"
}
