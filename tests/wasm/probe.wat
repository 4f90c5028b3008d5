;; probe: a module that crosses the runtime's limits on purpose, for tests/wasm.rs.
;; POST /o/probe/<name> with a body whose first byte picks what it does:
;;   c  answer {"n": <rows in t>}         w  insert a row (the body), answer {"n": 1}
;;   u  insert a row, then `unreachable`   s  insert a row, then loop for ever
;;   g  grow memory by 2 MiB (past memory_kb = 1024)
;;   o  write 1 MiB to stdout              f  try to open /etc/passwd   k  try to accept a socket
;;   e  call exit(3)                       r  recurse without end
(module
  (import "combd" "input" (func $input (param i32 i32 i32) (result i32)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (import "combd" "sql" (func $sql (param i32 i32) (result i32)))
  (import "combd" "sql_int" (func $sql_int (param i32 i32) (result i64)))
  (import "combd" "sql_bind_text" (func $bind_text (param i32 i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "sock_accept" (func $sock_accept (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "CREATE TABLE IF NOT EXISTS t (v TEXT NOT NULL);\00")
  (data (i32.const 128) "INSERT INTO t (v) VALUES (?1)")
  (data (i32.const 192) "SELECT COUNT(*) FROM t")
  (data (i32.const 256) "/etc/passwd")
  (data (i32.const 512) "{\"n\":")

  (func (export "schema") (result i32) (i32.const 16))
  (func (export "memory_kb") (result i32) (i32.const 1024))

  ;; Writes the decimal digits of $v at $at; answers how many.
  (func $itoa (param $v i64) (param $at i32) (result i32)
    (local $len i32) (local $i i32) (local $j i32) (local $t i32)
    (if (i64.lt_s (local.get $v) (i64.const 0))
      (then
        (i32.store8 (local.get $at) (i32.const 45))
        (return (i32.add (i32.const 1)
          (call $itoa (i64.sub (i64.const 0) (local.get $v)) (i32.add (local.get $at) (i32.const 1)))))))
    (loop $digit
      (i32.store8 (i32.add (local.get $at) (local.get $len))
        (i32.add (i32.const 48) (i32.wrap_i64 (i64.rem_u (local.get $v) (i64.const 10)))))
      (local.set $len (i32.add (local.get $len) (i32.const 1)))
      (local.set $v (i64.div_u (local.get $v) (i64.const 10)))
      (br_if $digit (i64.ne (local.get $v) (i64.const 0))))
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

  ;; Answers {"n": $v}.
  (func $reply (param $v i64)
    (local $len i32)
    (local.set $len (call $itoa (local.get $v) (i32.const 517)))
    (i32.store8 (i32.add (i32.const 517) (local.get $len)) (i32.const 125))
    (call $respond (i32.const 200) (i32.const 512) (i32.add (local.get $len) (i32.const 6))))

  (func $recurse (call $recurse))

  (func $insert
    (local $n i32)
    (local.set $n (call $input (i32.const 0) (i32.const 4096) (i32.const 1024)))
    (call $bind_text (i32.const 4096) (local.get $n))
    (drop (call $sql (i32.const 128) (i32.const 29))))

  (func (export "handle") (result i32)
    (local $op i32) (local $i i32)
    (drop (call $input (i32.const 0) (i32.const 0) (i32.const 1)))
    (local.set $op (i32.load8_u (i32.const 0)))
    (if (i32.eq (local.get $op) (i32.const 99)) ;; c
      (then
        (drop (call $sql (i32.const 192) (i32.const 22)))
        (call $reply (call $sql_int (i32.const 0) (i32.const 0)))
        (return (i32.const 0))))
    (if (i32.eq (local.get $op) (i32.const 119)) ;; w
      (then (call $insert) (call $reply (i64.const 1)) (return (i32.const 0))))
    (if (i32.eq (local.get $op) (i32.const 117)) ;; u
      (then (call $insert) (unreachable)))
    (if (i32.eq (local.get $op) (i32.const 115)) ;; s
      (then (call $insert) (loop $forever (br $forever))))
    (if (i32.eq (local.get $op) (i32.const 103)) ;; g
      (then
        (call $reply (i64.extend_i32_s (memory.grow (i32.const 32))))
        (return (i32.const 0))))
    (if (i32.eq (local.get $op) (i32.const 111)) ;; o: 1,024 writes of 1 KiB (1,023 x and a newline)
      (then
        (memory.fill (i32.const 8192) (i32.const 120) (i32.const 1023))
        (i32.store8 (i32.const 9215) (i32.const 10))
        (i32.store (i32.const 64) (i32.const 8192))
        (i32.store (i32.const 68) (i32.const 1024))
        (loop $write
          (drop (call $fd_write (i32.const 1) (i32.const 64) (i32.const 1) (i32.const 72)))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br_if $write (i32.lt_u (local.get $i) (i32.const 1024))))
        (call $reply (i64.const 0))
        (return (i32.const 0))))
    (if (i32.eq (local.get $op) (i32.const 102)) ;; f
      (then
        (call $reply (i64.extend_i32_s (call $path_open (i32.const 3) (i32.const 0)
          (i32.const 256) (i32.const 11) (i32.const 0) (i64.const -1) (i64.const -1)
          (i32.const 0) (i32.const 80))))
        (return (i32.const 0))))
    (if (i32.eq (local.get $op) (i32.const 107)) ;; k
      (then
        (call $reply (i64.extend_i32_s (call $sock_accept (i32.const 3) (i32.const 0) (i32.const 80))))
        (return (i32.const 0))))
    (if (i32.eq (local.get $op) (i32.const 101)) ;; e
      (then (call $exit (i32.const 3))))
    (if (i32.eq (local.get $op) (i32.const 114)) ;; r
      (then (call $recurse)))
    (i32.const 1))
)
