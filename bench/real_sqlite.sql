-- real_sqlite.sql - a fixed SQL workload for the unmodified sqlite3 shell (in-memory database),
-- run under each allocator and timed as a whole process with hyperfine by
-- scripts/bench-matrix.sh. The shell's SQLite uses the system malloc for pages, rows, sort
-- buffers and strings. How to read it: wall time of the whole process (lower is better) and
-- its peak RSS. Usage: sqlite3 :memory: < bench/real_sqlite.sql
PRAGMA cache_size = -65536;
CREATE TABLE orders(id INTEGER PRIMARY KEY, account INTEGER, price INTEGER, qty INTEGER, note TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 40000)
INSERT INTO orders SELECT i, (i * 7919) % 5000, 10000 + (i * 104729) % 997, 1 + i % 50,
                          printf('%.*c', 20 + (i * 31) % 300, 'n') FROM n;
CREATE INDEX orders_account ON orders(account, price);
SELECT count(*), sum(qty), max(length(note)) FROM orders;
SELECT account, count(*) AS c, sum(price * qty) AS v FROM orders GROUP BY account ORDER BY v DESC LIMIT 3;
SELECT group_concat(note, '') IS NOT NULL FROM (SELECT note FROM orders ORDER BY note, id LIMIT 10000);
UPDATE orders SET note = note || note WHERE id % 3 = 0;
DELETE FROM orders WHERE id % 5 = 0;
SELECT count(*), sum(length(note)) FROM orders;
SELECT a.account, count(*) FROM orders a JOIN orders b ON a.account = b.account AND b.id = a.id + 2000
 GROUP BY a.account ORDER BY 2 DESC LIMIT 3;
