#!/usr/bin/env bash
# Click 5,000 with backup off, backup on as before (TRUNCATE checkpoints: NODE_BIN of the
# commit before), and backup on with RESTART checkpoints (this commit), three alternated rounds.
# Usage: BEFORE_BIN=<combd of c8431b6> results/backup-2026-12-06/restart/restart.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
backup=$(mktemp -d)
trap 'rm -rf "$backup"' EXIT
for round in 1 2 3; do
  rm -rf "$backup"/*
  NODE_BIN=$BEFORE_BIN NODE_ENV="COMBD_BACKUP=$backup/a" bench/scenario.sh click restart-truncate-$round \
    --conns 5000 --interval-ms 10000 --duration-s 30 --board click
  NODE_ENV="COMBD_BACKUP=$backup/b" bench/scenario.sh click restart-restart-$round \
    --conns 5000 --interval-ms 10000 --duration-s 30 --board click
  bench/scenario.sh click restart-off-$round \
    --conns 5000 --interval-ms 10000 --duration-s 30 --board click
done
