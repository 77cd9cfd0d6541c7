#!/usr/bin/env bash
# make test's stages, in order: "a+b" runs stages a and b side by side (they share
# nothing: the library's tests and the judge's, say), each into a log of its own that
# is printed whole once all are done. Stops at the first step that fails; prints how
# long each stage took (one that ran beside others: from the step's start to its end).
#   usage: tests/run_stages.sh lint test-unit+test-practice test-notebooks ...
set -u
make=${MAKE:-make}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
times=""
total=$(date +%s)
for step in "$@"; do
  start=$(date +%s)
  status=0
  IFS=+ read -ra parts <<< "$step"
  if [ "${#parts[@]}" = 1 ]; then
    $make --no-print-directory "$step" || status=$?
    times+=$(printf '  %-15s %5d s' "$step" $(($(date +%s) - start)))"\n"
  else
    for part in "${parts[@]}"; do
      echo "make test: $part runs beside ${step//+/ and } (its log follows when they end)"
      ( $make --no-print-directory "$part" > "$logs/$part.log" 2>&1
        echo $? > "$logs/$part.rc"; date +%s > "$logs/$part.end" ) &
    done
    wait
    for part in "${parts[@]}"; do
      printf '\n----- %s -----\n' "$part"
      cat "$logs/$part.log"
      [ "$(cat "$logs/$part.rc")" = 0 ] || status=$(cat "$logs/$part.rc")
      times+=$(printf '  %-15s %5d s' "$part" $(($(cat "$logs/$part.end") - start)))"\n"
    done
  fi
  if [ "$status" != 0 ]; then
    printf "\nmake test: %s failed. Stage times:\n$times" "$step"
    exit "$status"
  fi
done
printf "\nmake test passed. Stage times:\n$times  %-15s %5d s\n" total $(($(date +%s) - total))
