/* combd.h: the combd module ABI (version 1) for C, with clang's wasm32-wasi target.
 *
 * A module is one app. It exports `memory`, `handle`, and optionally `handle_batch`, `topic`,
 * `schema`, `memory_kb`, `resync` (see the README, "Apps as WebAssembly modules"). Everything
 * else it needs from the node it imports from "combd" (below) and, for stdout and stderr,
 * from "wasi_snapshot_preview1" (wasi-libc's printf does that; call fflush before returning).
 * Lengths are bytes; a "copy" call copies at most `cap` bytes and answers the full length. */
#ifndef COMBD_H
#define COMBD_H

#include <stdint.h>

#define COMBD_IMPORT(name) __attribute__((import_module("combd"), import_name(name)))
#define COMBD_EXPORT(name) __attribute__((export_name(name)))

/* The input being handled (in handle_batch: the one `combd_select` chose). */
enum { COMBD_HTTP = 0, COMBD_TEXT = 1, COMBD_BINARY = 2, COMBD_ATTACH = 3, COMBD_DETACH = 4 };
enum { COMBD_BODY = 0, COMBD_QUERY = 1, COMBD_METHOD = 2 };
COMBD_IMPORT("kind") int32_t combd_kind(void);
COMBD_IMPORT("session_shard") int32_t combd_session_shard(void);
COMBD_IMPORT("session_id") int64_t combd_session_id(void);
/* Copies part COMBD_BODY (request body, message), COMBD_QUERY or COMBD_METHOD; -1 if absent. */
COMBD_IMPORT("input") int32_t combd_input(int32_t part, void *buf, int32_t cap);
/* In handle_batch: makes input i current; answers its kind, or -1 past the last. */
COMBD_IMPORT("select") int32_t combd_select(int32_t i);

/* The answer to the current input: a JSON response, or a failure (rolled back). */
COMBD_IMPORT("respond") void combd_respond(int32_t status, const void *json, int32_t len);
COMBD_IMPORT("fail") void combd_fail(int32_t status, const char *message, int32_t len);
COMBD_IMPORT("log") void combd_log(const char *line, int32_t len);

/* SQL on the object's database, in the call's transaction. Bind ?1, ?2, ... in order, then
 * run: answers the number of rows (kept until the next statement), or -1 (see sql_error). */
COMBD_IMPORT("sql_bind_null") void combd_bind_null(void);
COMBD_IMPORT("sql_bind_int") void combd_bind_int(int64_t v);
COMBD_IMPORT("sql_bind_float") void combd_bind_float(double v);
COMBD_IMPORT("sql_bind_text") void combd_bind_text(const char *s, int32_t len);
COMBD_IMPORT("sql_bind_blob") void combd_bind_blob(const void *b, int32_t len);
COMBD_IMPORT("sql") int32_t combd_sql(const char *sql, int32_t len);
COMBD_IMPORT("sql_changes") int64_t combd_sql_changes(void);
COMBD_IMPORT("sql_columns") int32_t combd_sql_columns(void);
/* -1 no such cell, 0 NULL, 1 integer, 2 float, 3 text, 4 blob. */
COMBD_IMPORT("sql_type") int32_t combd_sql_type(int32_t row, int32_t col);
COMBD_IMPORT("sql_int") int64_t combd_sql_int(int32_t row, int32_t col);
COMBD_IMPORT("sql_float") double combd_sql_float(int32_t row, int32_t col);
COMBD_IMPORT("sql_text") int32_t combd_sql_text(int32_t row, int32_t col, void *buf, int32_t cap);
COMBD_IMPORT("sql_error") int32_t combd_sql_error(char *buf, int32_t cap);

/* Messages, sent once the call commits. */
COMBD_IMPORT("send") int32_t combd_send(int32_t shard, int64_t id, const char *text, int32_t len);
COMBD_IMPORT("send_binary") int32_t combd_send_binary(int32_t shard, int64_t id, const void *b, int32_t len);
COMBD_IMPORT("broadcast") int32_t combd_broadcast(const char *topic, int32_t topic_len,
                                                  const char *text, int32_t len);

#endif
