;; __NAME__: a module in the WebAssembly text format, written by `combd new`. Each object
;; counts the POSTs it gets: `curl -X POST localhost:8080/o/__NAME__/a` answers {"seen":1},
;; {"seen":2}, … The node reads this file as it is (no build); edit it and `kill -HUP` the node.
(module
  (import "combd" "sql" (func $sql (param i32 i32) (result i32)))
  (import "combd" "sql_int" (func $int (param i32 i32) (result i64)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "CREATE TABLE IF NOT EXISTS n (v INTEGER); INSERT INTO n SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM n);\00")
  (data (i32.const 200) "UPDATE n SET v = v + 1 RETURNING v")
  (data (i32.const 300) "{\"seen\":")
  (func (export "schema") (result i32) (i32.const 0))
  (func (export "handle") (result i32)
    (local $v i64) (local $at i32)
    (drop (call $sql (i32.const 200) (i32.const 34)))
    (local.set $v (call $int (i32.const 0) (i32.const 0)))
    ;; the answer is built backwards from its end at 420: "}", the digits of v from the last
    ;; one, then the 8 bytes of {"seen": copied in front of them
    (i32.store8 (i32.const 420) (i32.const 125))
    (local.set $at (i32.const 420))
    (loop $digit
      (local.set $at (i32.sub (local.get $at) (i32.const 1)))
      (i32.store8 (local.get $at)
        (i32.add (i32.const 48) (i32.wrap_i64 (i64.rem_u (local.get $v) (i64.const 10)))))
      (local.set $v (i64.div_u (local.get $v) (i64.const 10)))
      (br_if $digit (i64.ne (local.get $v) (i64.const 0))))
    (local.set $at (i32.sub (local.get $at) (i32.const 8)))
    (memory.copy (local.get $at) (i32.const 300) (i32.const 8))
    (call $respond (i32.const 200) (local.get $at) (i32.sub (i32.const 421) (local.get $at)))
    (i32.const 0)))
