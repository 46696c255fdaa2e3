#!/usr/bin/env bash
# interop-venv.sh: make (once) the Python environment the interop test
# (tests/cli/interop.bats, tests/ref/interop_check.py) runs in: Debian's
# python3 and python3-torch, plus the PyPI packages users trade GPT-2
# weights with, pinned to releases that work with Debian's PyTorch 1.13.
# Prints the environment's python3 on stdout; exit 1, saying why on stderr,
# when it cannot be made (no network: the test then skips).
#   scripts/interop-venv.sh [DIR]   [$FLOW_INTEROP_VENV, ~/.cache/flow/interop-venv]
set -uo pipefail

venv=${1:-${FLOW_INTEROP_VENV:-$HOME/.cache/flow/interop-venv}}
pins=(safetensors==0.8.0 transformers==4.36.2)
py=$venv/bin/python3

ready() {
	"$py" -c 'import safetensors, transformers, torch' >/dev/null 2>&1 &&
		[ "$(cat "$venv/.flow-pins" 2>/dev/null)" = "${pins[*]}" ]
}

if ! ready; then
	echo "interop-venv: installing ${pins[*]} into $venv" >&2
	# Debian's own python3: the one whose site-packages hold python3-torch.
	/usr/bin/python3 -m venv --system-site-packages "$venv" >&2 &&
		"$py" -m pip install -q --disable-pip-version-check "${pins[@]}" >&2 &&
		printf '%s' "${pins[*]}" > "$venv/.flow-pins" || {
		echo "interop-venv: could not install ${pins[*]} (no network?)" >&2
		exit 1
	}
fi
echo "$py"
