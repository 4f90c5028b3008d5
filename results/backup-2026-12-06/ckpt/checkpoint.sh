#!/usr/bin/env bash
# Click 5,000 with backup off, backup on as before (c8431b6: TRUNCATE, and a busy object never
# checkpointed), and backup on as now (RESTART checkpoints once the writer holds the last batch),
# three alternated rounds. Usage: BEFORE_BIN=<combd of c8431b6> results/backup-2026-12-06/ckpt/checkpoint.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
backup=$(mktemp -d)
trap 'rm -rf "$backup"' EXIT
for round in 1 2 3; do
  rm -rf "$backup"/*
  NODE_BIN=$BEFORE_BIN NODE_ENV="COMBD_BACKUP=$backup/a" bench/scenario.sh click ckpt-before-$round \
    --conns 5000 --interval-ms 10000 --duration-s 30 --board click
  NODE_ENV="COMBD_BACKUP=$backup/b" bench/scenario.sh click ckpt-after-$round \
    --conns 5000 --interval-ms 10000 --duration-s 30 --board click
  bench/scenario.sh click ckpt-off-$round \
    --conns 5000 --interval-ms 10000 --duration-s 30 --board click
done
