package sink

import (
	"testing"

	"github.com/IBM/sarama"
)

// BenchmarkDirectHotPath is the direct engine's per-record work without the
// network: publish, build a batch, answer it, 100 records per request (a
// drain), the cost issue 38's changes must not raise.
func BenchmarkDirectHotPath(b *testing.B) {
	d, _, db, _ := directRigB(b)
	msgs := make([]*Message, 100)
	for i := range msgs {
		msgs[i] = &Message{Topic: "orders", Key: []byte("order-1"), Value: make([]byte, 100), Done: func(error) {}}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N / len(msgs) {
		for _, m := range msgs {
			if err := d.publish(m); err != nil {
				b.Fatal(err)
			}
		}
		d.answer(db, respond(d.build(db), sarama.ErrNoError), nil)
	}
}

func directRigB(b *testing.B) (*direct, *dpart, *dbroker, *verdicts) {
	cfg := validConfig()
	cfg.RetryMax, cfg.MaxMessageBytes = 5, 1000000
	sc, err := saramaConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	d := newDirect(nil, sc, cfg, func(string, []*Message, error) {})
	d.pid, d.epoch, d.newPID = 1000, 0, false
	db := &dbroker{wake: make(chan struct{}, 1)}
	tp := &dtopic{name: "orders", fixing: true}
	p := &dpart{topic: tp, id: 0, leader: db, pid: -1}
	tp.parts = []*dpart{p}
	d.topics["orders"] = tp
	return d, p, db, nil
}
