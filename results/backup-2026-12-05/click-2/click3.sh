#!/usr/bin/env bash
cd "$(dirname "$0")/../../.."
for i in 1 2 3; do
  NODE_ENV="" bench/scenario.sh click backup3-off-$i --conns 5000 --interval-ms 10000 --duration-s 30 --board click
  bk=$(mktemp -d)
  NODE_ENV="COMBD_BACKUP=$bk" bench/scenario.sh click backup3-on-$i --conns 5000 --interval-ms 10000 --duration-s 30 --board click
  rm -rf $bk
done
