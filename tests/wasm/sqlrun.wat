;; sqlrun: runs the SQL it is given, for the hostile-module tests in tests/sandbox.rs.
;; POST /o/sqlrun/<name> with SQL as the body: runs it (one statement, no parameters) and
;; answers {"n": <its row count, or -1 if it failed>}. Its schema makes a table t; it may hold
;; 2 MiB (memory_kb).
(module
  (import "combd" "input" (func $input (param i32 i32 i32) (result i32)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (import "combd" "sql" (func $sql (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "CREATE TABLE IF NOT EXISTS t (v TEXT);\00")
  (data (i32.const 512) "{\"n\":")

  (func (export "schema") (result i32) (i32.const 16))
  ;; 2 MiB: its linear memory (64 KiB) and what the node holds for its calls.
  (func (export "memory_kb") (result i32) (i32.const 2048))

  ;; Writes the decimal digits of $v (0 to 2^31) at $at; answers how many.
  (func $itoa (param $v i32) (param $at i32) (result i32)
    (local $len i32) (local $i i32) (local $j i32) (local $t i32)
    (loop $digit
      (i32.store8 (i32.add (local.get $at) (local.get $len))
        (i32.add (i32.const 48) (i32.rem_u (local.get $v) (i32.const 10))))
      (local.set $len (i32.add (local.get $len) (i32.const 1)))
      (local.set $v (i32.div_u (local.get $v) (i32.const 10)))
      (br_if $digit (i32.ne (local.get $v) (i32.const 0))))
    (local.set $j (i32.sub (local.get $len) (i32.const 1)))
    (block $done
      (loop $swap
        (br_if $done (i32.ge_s (local.get $i) (local.get $j)))
        (local.set $t (i32.load8_u (i32.add (local.get $at) (local.get $i))))
        (i32.store8 (i32.add (local.get $at) (local.get $i))
          (i32.load8_u (i32.add (local.get $at) (local.get $j))))
        (i32.store8 (i32.add (local.get $at) (local.get $j)) (local.get $t))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (local.set $j (i32.sub (local.get $j) (i32.const 1)))
        (br $swap)))
    (local.get $len))

  (func (export "handle") (result i32)
    (local $n i32) (local $r i32) (local $len i32) (local $at i32)
    (local.set $n (call $input (i32.const 0) (i32.const 4096) (i32.const 8192)))
    (local.set $r (call $sql (i32.const 4096) (local.get $n)))
    (local.set $at (i32.const 517))
    (if (i32.lt_s (local.get $r) (i32.const 0))
      (then
        (i32.store8 (i32.const 517) (i32.const 45))
        (local.set $at (i32.const 518))
        (local.set $r (i32.sub (i32.const 0) (local.get $r)))))
    (local.set $len (i32.add (i32.sub (local.get $at) (i32.const 517))
      (call $itoa (local.get $r) (local.get $at))))
    (i32.store8 (i32.add (i32.const 517) (local.get $len)) (i32.const 125))
    (call $respond (i32.const 200) (i32.const 512) (i32.add (local.get $len) (i32.const 6)))
    (i32.const 0))
)
