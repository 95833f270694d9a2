#!/usr/bin/env bash
# fxpilot: start COMMAND detached from the SSH session, in its own session and process group.
# RUN_DIR receives: command, pid, pgid, stdout, stderr, and exit_code once the command has ended.
# usage: detach.sh RUN_DIR COMMAND
set -eu
if [ $# -ne 2 ]; then echo "usage: detach.sh RUN_DIR COMMAND" >&2; exit 2; fi
run_dir=$1 command=$2
mkdir -p "$run_dir"
cd "$run_dir"
if [ -s pgid ] && [ ! -f exit_code ] && [ ! -f canceled ] && kill -0 -- "-$(cat pgid)" 2> /dev/null; then
  echo "detach.sh: $run_dir already holds the running process group $(cat pgid)" >&2
  exit 3
fi
rm -f pid wrapper_pid pgid exit_code canceled stdout stderr
printf '%s\n' "$command" > command
# setsid: a new session and process group, so the command outlives this SSH session and is killed as one group.
# pid is the command's own process (a command starting with `exec` becomes the server itself), not this wrapper's;
# the wrapper's pid goes to wrapper_pid.
setsid bash -c '
  echo $$ > wrapper_pid
  bash -c "$1" > stdout 2> stderr < /dev/null &
  child=$!
  echo $child > pid.part && mv pid.part pid
  { ps -o pgid= -p $$ 2> /dev/null || awk "{print \$5}" /proc/$$/stat; } | tr -d " " > pgid.part && mv pgid.part pgid
  wait $child
  echo $? > exit_code.part && mv exit_code.part exit_code
' fxpilot-detached "$command" > /dev/null 2>&1 < /dev/null &
for _ in $(seq 200); do [ -s pgid ] && [ -s pid ] && break; sleep 0.05; done
if [ ! -s pgid ]; then echo "detach.sh: the command did not start within 10 s" >&2; exit 1; fi
printf 'pid=%s pgid=%s dir=%s\n' "$(cat pid)" "$(cat pgid)" "$(pwd)"
