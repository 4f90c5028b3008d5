#!/usr/bin/env bash
# Click 5,000 with backup on (a 200 ms round, a first WAL read of 4 frames) and off, three
# alternated rounds. Usage: results/backup-2026-12-06/round/round.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
backup=$(mktemp -d)
trap 'rm -rf "$backup"' EXIT
for round in 1 2 3; do
  rm -rf "$backup"/*
  NODE_ENV="COMBD_BACKUP=$backup/b" bench/scenario.sh click round-on-$round \
    --conns 5000 --interval-ms 10000 --duration-s 30 --board click
  bench/scenario.sh click round-off-$round \
    --conns 5000 --interval-ms 10000 --duration-s 30 --board click
done
