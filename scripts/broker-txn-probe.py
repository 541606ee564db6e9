#!/usr/bin/env python3
"""What a Kafka-protocol broker does with transactions (docs/testing.md, "The
test broker"): commit, abort, an open transaction, a producer abandoned mid-
transaction, and fencing (two producers with one transactional.id).

    python3 -m venv /tmp/probe && /tmp/probe/bin/pip install confluent-kafka==2.16.1
    scripts/broker.sh start 19092
    /tmp/probe/bin/python scripts/broker-txn-probe.py 127.0.0.1:19092
    scripts/broker.sh stop 19092

Each line names a case and what a read_committed reader of its topic sees
(Apache Kafka: only committed records; the zombie's commit fails with
PRODUCER_FENCED at once).
"""
import os
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BS = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:19092"
RUN = str(os.getpid())


def topic(name):
    t = f"probe{RUN}-{name}"
    admin = AdminClient({"bootstrap.servers": BS})  # kept alive until the answer
    admin.create_topics([NewTopic(t, 1, 1)])[t].result()
    return t


def txn_producer(tid, timeout_ms=60000):
    p = Producer({"bootstrap.servers": BS, "transactional.id": f"probe{RUN}-{tid}",
                  "transaction.timeout.ms": timeout_ms})
    p.init_transactions(30)
    return p


def read(t, isolation="read_committed"):
    c = Consumer({"bootstrap.servers": BS, "group.id": f"probe{RUN}-{time.time()}",
                  "isolation.level": isolation, "enable.partition.eof": True})
    c.assign([TopicPartition(t, 0, 0)])
    seen = []
    while True:
        m = c.poll(5)
        if m is None:
            seen.append("<no end of partition in 5 s>")
            break
        if m.error():
            break
        seen.append(m.value().decode())
    c.close()
    return seen


t = topic("commit")
p = txn_producer("commit")
p.begin_transaction()
p.produce(t, b"committed")
p.commit_transaction(30)
print("commit:", read(t))

t = topic("abort")
p = txn_producer("abort")
p.begin_transaction()
p.produce(t, b"aborted")
p.flush(30)
p.abort_transaction(30)
print("abort:", read(t))

t = topic("open")
p = txn_producer("open")
p.begin_transaction()
p.produce(t, b"open")
p.flush(30)
print("open transaction:", read(t))
p.abort_transaction(30)

t = topic("abandoned")
pid = os.fork()
if pid == 0:  # a producer killed inside its transaction (kill -9)
    q = txn_producer("abandoned", timeout_ms=5000)
    q.begin_transaction()
    q.produce(t, b"abandoned")
    q.flush(30)
    os._exit(0)
os.waitpid(pid, 0)
plain = Producer({"bootstrap.servers": BS})
plain.produce(t, b"plain-after")
plain.flush(30)
time.sleep(15)
print("abandoned, transaction.timeout.ms 5 s, 15 s later:", read(t))
txn_producer("abandoned")
print("abandoned, after its transactional.id is initialised again:", read(t))

t = topic("fence")
zombie = txn_producer("fence")
zombie.begin_transaction()
zombie.produce(t, b"zombie")
zombie.flush(30)
successor = txn_producer("fence")
start = time.monotonic()
try:
    zombie.commit_transaction(30)
    print(f"fencing: the zombie's commit succeeded ({time.monotonic() - start:.1f} s)")
except KafkaException as e:
    err = e.args[0]
    print(f"fencing: the zombie's commit failed after {time.monotonic() - start:.1f} s: "
          f"{err.name()} (fatal={err.fatal()}, retriable={err.retriable()})")
print("fencing: read_committed after the successor's init_transactions:", read(t))
