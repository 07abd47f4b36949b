package sink

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/klauspost/compress/gzip"
	snappy "github.com/klauspost/compress/snappy/xerial"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"

	"github.com/outbox-relay/outbox-relay/internal/rawconn"
)

// wire is the direct engine's connection to one broker for produce
// requests. sarama's Broker encodes a request twice over (a sizing pass,
// then each record batch into a fresh slice that is copied into a second
// fresh request buffer): a fifth of the relay's CPU in a drain, and two
// large allocations per request. wire writes each record once into a
// buffer it keeps, and reads the response on the sending goroutine (one
// request is in flight per broker anyway), which saves the wake-up of a
// response reader.
//
// Metadata and producer ids still go through sarama's client. wire speaks
// the non-flexible protocol versions every broker since 2.4 serves and
// Kafka 4 kept: Produce v3..v8, SaslHandshake v1, SaslAuthenticate v1.
type wire struct {
	conn     net.Conn
	r        *bufio.Reader
	sc       *sarama.Config
	clientID string
	corr     int32
	reauth   time.Time // the SASL session ends: redial before then (zero: never)
	last     time.Time // the last request

	req  []byte // the request being built, kept between requests up to keep bytes
	keep int    // keepRequestBuffer, or more while the stream catches up
	raw  []byte // a batch's records before compression
	resp []byte

	gz   *gzip.Writer
	lz   *lz4.Writer
	zstd *zstd.Encoder
	cbuf bytes.Buffer
}

const (
	apiProduce          = 0
	apiSaslHandshake    = 17
	apiSaslAuthenticate = 36
	maxProduceVersion   = 8 // the last non-flexible one
	keepRequestBuffer   = 4 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// wireVersion is the Produce version wire sends for the configured
// kafka.version.
func wireVersion(v sarama.KafkaVersion) int16 {
	return min(produceVersion(v), maxProduceVersion)
}

// dialWire connects to addr with sc's dialer, TLS and SASL settings.
func dialWire(addr string, sc *sarama.Config) (*wire, error) {
	d := net.Dialer{Timeout: sc.Net.DialTimeout, KeepAlive: sc.Net.KeepAlive, LocalAddr: sc.Net.LocalAddr}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("connect to broker %s: %w", addr, err)
	}
	conn = rawconn.Wrap(conn)
	if sc.Net.TLS.Enable {
		cfg := sc.Net.TLS.Config
		if cfg == nil {
			cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		if cfg.ServerName == "" && !cfg.InsecureSkipVerify {
			host, _, _ := net.SplitHostPort(addr)
			cfg = cfg.Clone()
			cfg.ServerName = host
		}
		tc := tls.Client(conn, cfg)
		_ = tc.SetDeadline(time.Now().Add(sc.Net.DialTimeout))
		if err := tc.Handshake(); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("TLS handshake with broker %s: %w", addr, err)
		}
		_ = tc.SetDeadline(time.Time{})
		conn = tc
	}
	w := &wire{conn: conn, r: bufio.NewReaderSize(conn, 4096), sc: sc, clientID: sc.ClientID}
	if sc.Net.SASL.Enable {
		if err := w.authenticate(); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("SASL %s with broker %s: %w", sc.Net.SASL.Mechanism, addr, err)
		}
	}
	return w, nil
}

func (w *wire) close() { _ = w.conn.Close() }

// wireIdle is how long a connection may stay unused before the next
// request dials a new one: brokers close idle connections after
// connections.max.idle.ms (10 minutes by default), and a request on a
// connection the broker has just closed fails and waits for a retry.
const wireIdle = 5 * time.Minute

// expired reports whether the connection should be replaced before the
// next request: the broker's SASL session is about to end, or it has been
// idle long enough for the broker to close it.
func (w *wire) expired(now time.Time) bool {
	return (!w.reauth.IsZero() && now.After(w.reauth)) || (!w.last.IsZero() && now.Sub(w.last) > wireIdle)
}

// begin starts a request of api/version in w.req after the size field.
func (w *wire) begin(api, version int16) {
	w.corr++
	b := w.req[:0]
	b = binary.BigEndian.AppendUint32(b, 0) // size, set by roundTrip
	b = binary.BigEndian.AppendUint16(b, uint16(api))
	b = binary.BigEndian.AppendUint16(b, uint16(version))
	b = binary.BigEndian.AppendUint32(b, uint32(w.corr))
	w.req = appendString(b, w.clientID)
}

// roundTrip sends w.req and returns the response body (after the
// correlation id), valid until the next request.
func (w *wire) roundTrip(wait time.Duration) ([]byte, error) {
	binary.BigEndian.PutUint32(w.req, uint32(len(w.req)-4))
	w.last = time.Now()
	_ = w.conn.SetWriteDeadline(w.last.Add(w.sc.Net.WriteTimeout))
	_, err := w.conn.Write(w.req)
	if cap(w.req) > max(w.keep, keepRequestBuffer) {
		w.req = nil // a huge request in live traffic: do not keep its buffer
	}
	if err != nil {
		return nil, err
	}
	_ = w.conn.SetReadDeadline(time.Now().Add(w.sc.Net.ReadTimeout + wait))
	var head [8]byte
	if _, err := io.ReadFull(w.r, head[:]); err != nil {
		return nil, err
	}
	size := int32(binary.BigEndian.Uint32(head[:4]))
	if corr := int32(binary.BigEndian.Uint32(head[4:])); corr != w.corr || size < 4 || size > 64<<20 {
		return nil, fmt.Errorf("response of %d bytes with correlation id %d, want %d: %w", size, corr, w.corr, sarama.ErrIncompleteResponse)
	}
	if cap(w.resp) < int(size-4) {
		w.resp = make([]byte, size-4)
	}
	w.resp = w.resp[:size-4]
	if _, err := io.ReadFull(w.r, w.resp); err != nil {
		return nil, err
	}
	return w.resp, nil
}

// authenticate runs SaslHandshake v1 and SaslAuthenticate v1 for PLAIN,
// SCRAM or OAUTHBEARER (the mechanisms kafka.sasl offers). A refusal is the broker's
// error code as a sarama.KError, so IsAuthError and Classify know it.
func (w *wire) authenticate() error {
	s := w.sc.Net.SASL
	w.begin(apiSaslHandshake, 1)
	w.req = appendString(w.req, string(s.Mechanism))
	body, err := w.roundTrip(0)
	if err != nil {
		return err
	}
	rd := reader{b: body}
	if code := rd.int16(); code != 0 || rd.err != nil {
		return errors.Join(sarama.KError(code), rd.err)
	}
	step := func(msg []byte) ([]byte, error) {
		w.begin(apiSaslAuthenticate, 1)
		w.req = appendBytes(w.req, msg)
		body, err := w.roundTrip(0)
		if err != nil {
			return nil, err
		}
		rd := reader{b: body}
		code, text, reply, life := rd.int16(), rd.nullableString(), rd.bytes(), rd.int64()
		if rd.err != nil {
			return nil, rd.err
		}
		if code != 0 {
			if text != "" {
				return nil, fmt.Errorf("%w: %s", sarama.KError(code), text)
			}
			return nil, sarama.KError(code)
		}
		if life > 0 { // KIP-368: the broker closes the connection at the end of the session
			w.reauth = time.Now().Add(time.Duration(life) * time.Millisecond * 9 / 10)
		}
		return reply, nil
	}
	switch s.Mechanism {
	case sarama.SASLTypeOAuth:
		tok, err := s.TokenProvider.Token()
		if err != nil {
			return err // the source's error names it, never the token
		}
		challenge, err := step(oauthClientFirst(tok))
		if err != nil || len(challenge) == 0 {
			return err
		}
		// RFC 7628 3.2.2: a refusal comes as a JSON status; the client
		// answers %x01 and the broker then fails the exchange.
		status := string(challenge)
		if len(status) > 256 {
			status = status[:256]
		}
		if _, err := step([]byte{1}); err != nil {
			if !strings.Contains(err.Error(), status) {
				err = fmt.Errorf("%w (status %s)", err, status)
			}
			return err
		}
		return fmt.Errorf("%w: the broker answered %s", sarama.ErrSASLAuthenticationFailed, status)
	case sarama.SASLTypePlaintext:
		_, err := step([]byte(s.AuthIdentity + "\x00" + s.User + "\x00" + s.Password))
		return err
	case sarama.SASLTypeSCRAMSHA256, sarama.SASLTypeSCRAMSHA512:
		c := s.SCRAMClientGeneratorFunc()
		if err := c.Begin(s.User, s.Password, s.SCRAMAuthzID); err != nil {
			return err
		}
		msg, err := c.Step("")
		for err == nil && !c.Done() {
			var challenge []byte
			if challenge, err = step([]byte(msg)); err == nil {
				msg, err = c.Step(string(challenge))
			}
		}
		var kerr sarama.KError
		if err != nil && !errors.As(err, &kerr) {
			err = fmt.Errorf("%w: %w", sarama.ErrSASLAuthenticationFailed, err) // the client refused the server's proof
		}
		return err
	}
	return fmt.Errorf("mechanism %q: %w", s.Mechanism, sarama.ErrUnsupportedSASLMechanism)
}

// produce sends batches (acks=all) and records the broker's answer in each
// batch's got and err; it returns the response's throttle time. An error
// return is the request's: the connection is not usable after it.
func (w *wire) produce(d *direct, batches []*dbatch) (time.Duration, error) {
	// A drain sends requests of up to maxReq back to back: dropping the
	// buffer after each made the next one grow anew, 1.25x at a time (about
	// 50 MB allocated, copied and page-faulted per 300k-event drain).
	w.keep = keepRequestBuffer
	if d.catchingUp.Load() {
		w.keep = d.maxReq + 2*d.maxBatch
	}
	if err := w.encodeProduce(d, batches); err != nil {
		return 0, err
	}
	body, err := w.roundTrip(time.Duration(d.timeout) * time.Millisecond)
	if err != nil {
		return 0, err
	}
	throttle, err := answerProduce(body, d.wireVersion, batches)
	return time.Duration(throttle) * time.Millisecond, err
}

// encodeProduce builds the Produce request of batches in w.req, sorting
// batches by topic and partition.
func (w *wire) encodeProduce(d *direct, batches []*dbatch) error {
	slices.SortFunc(batches, func(a, b *dbatch) int {
		if c := strings.Compare(a.part.topic.name, b.part.topic.name); c != 0 {
			return c
		}
		return int(a.part.id) - int(b.part.id)
	})
	version := d.wireVersion
	w.begin(apiProduce, version)
	b := binary.BigEndian.AppendUint16(w.req, 0xffff) // no transactional id
	b = binary.BigEndian.AppendUint16(b, 0xffff)      // acks = -1: all in-sync replicas
	b = binary.BigEndian.AppendUint32(b, uint32(d.timeout))
	topics := 0
	for i := range batches {
		if i == 0 || batches[i].part.topic != batches[i-1].part.topic {
			topics++
		}
	}
	b = binary.BigEndian.AppendUint32(b, uint32(topics))
	if d.codec == sarama.CompressionNone {
		// One allocation of the whole request instead of growing it: the
		// batches' sizes bound their records (as sarama counts them).
		need := 0
		for i, bt := range batches {
			need += bt.size + 8 // partition id, batch size
			if i == 0 || bt.part.topic != batches[i-1].part.topic {
				need += 2 + len(bt.part.topic.name) + 4
			}
		}
		b = slices.Grow(b, need)
	}
	var err error
	for i := 0; i < len(batches); {
		t := batches[i].part.topic
		j := i
		for j < len(batches) && batches[j].part.topic == t {
			j++
		}
		b = appendString(b, t.name)
		b = binary.BigEndian.AppendUint32(b, uint32(j-i))
		for _, bt := range batches[i:j] {
			bt.got, bt.err = false, nil
			b = binary.BigEndian.AppendUint32(b, uint32(bt.part.id))
			at := len(b)
			b = binary.BigEndian.AppendUint32(b, 0) // the batch's size
			if b, err = w.appendBatch(b, d, bt); err != nil {
				w.req = b
				return fmt.Errorf("encode batch of topic %s partition %d: %w", t.name, bt.part.id, err)
			}
			binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-4))
		}
		i = j
	}
	w.req = b
	return nil
}

// answerProduce reads a Produce v3..v8 response into batches (sorted by
// topic and partition) and returns its throttle time in ms. (The SASL
// responses wire reads carry none at the versions it sends.)
func answerProduce(body []byte, version int16, batches []*dbatch) (int32, error) {
	rd := reader{b: body}
	for range rd.count() {
		name := rd.stringBytes()
		for range rd.count() {
			id, code := rd.int32(), rd.int16()
			rd.skip(8 + 8) // base offset, log append time
			if version >= 5 {
				rd.skip(8) // log start offset
			}
			var text string
			if version >= 8 {
				for range rd.count() { // record errors: the batch fails as a whole
					rd.skip(4)
					rd.nullableString()
				}
				text = rd.nullableString()
			}
			if rd.err != nil {
				break
			}
			i := findBatch(batches, name, id)
			if i < 0 {
				continue // not asked for: ignored
			}
			bt := batches[i]
			bt.got = true
			if code != 0 {
				bt.err = sarama.KError(code)
				if text != "" {
					bt.err = fmt.Errorf("%w: %s", sarama.KError(code), text)
				}
			}
		}
	}
	throttle := rd.int32()
	if rd.err != nil {
		return 0, fmt.Errorf("produce response: %w", rd.err)
	}
	return max(throttle, 0), nil
}

// findBatch returns the index of topic name's partition id in batches
// (sorted by topic and partition), or -1.
func findBatch(batches []*dbatch, name []byte, id int32) int {
	i, ok := slices.BinarySearchFunc(batches, id, func(b *dbatch, id int32) int {
		if c := strings.Compare(b.part.topic.name, string(name)); c != 0 {
			return c
		}
		return int(b.part.id) - int(id)
	})
	if !ok {
		return -1
	}
	return i
}

// appendBatch appends bt as a v2 record batch.
func (w *wire) appendBatch(b []byte, d *direct, bt *dbatch) ([]byte, error) {
	start := len(b)
	b = binary.BigEndian.AppendUint64(b, 0)          // base offset
	b = binary.BigEndian.AppendUint32(b, 0)          // length, set below
	b = binary.BigEndian.AppendUint32(b, 0xffffffff) // partition leader epoch: none
	b = append(b, 2)                                 // magic
	crcAt := len(b)
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(d.codec)) // attributes: codec, create time, not transactional
	b = binary.BigEndian.AppendUint32(b, uint32(len(bt.msgs)-1))
	b = binary.BigEndian.AppendUint64(b, uint64(bt.first))
	maxAt := len(b)
	b = binary.BigEndian.AppendUint64(b, 0) // max timestamp, known once the records are written
	b = binary.BigEndian.AppendUint64(b, uint64(bt.pid))
	b = binary.BigEndian.AppendUint16(b, uint16(bt.epoch))
	b = binary.BigEndian.AppendUint32(b, uint32(bt.seq))
	b = binary.BigEndian.AppendUint32(b, uint32(len(bt.msgs)))
	var maxDelta int64
	if d.codec == sarama.CompressionNone {
		b, maxDelta = appendRecords(b, bt)
	} else {
		w.raw, maxDelta = appendRecords(w.raw[:0], bt)
		var err error
		if b, err = w.compress(b, d.codec, d.level, w.raw); err != nil {
			return b, err
		}
		if cap(w.raw) > keepRequestBuffer {
			w.raw = nil
		}
	}
	binary.BigEndian.PutUint64(b[maxAt:], uint64(bt.first+maxDelta))
	binary.BigEndian.PutUint32(b[start+8:], uint32(len(b)-start-12))
	binary.BigEndian.PutUint32(b[crcAt:], crc32.Checksum(b[crcAt+4:], castagnoli))
	return b, nil
}

// appendRecords appends bt's records and returns the largest timestamp
// delta. Each record's size is counted first: its length leads it as a
// varint.
func appendRecords(b []byte, bt *dbatch) ([]byte, int64) {
	var maxDelta int64
	for i, m := range bt.msgs {
		delta := bt.first
		if !m.Timestamp.IsZero() {
			delta = m.Timestamp.UnixMilli()
		}
		delta -= bt.first
		maxDelta = max(maxDelta, delta)
		n := 1 + varintLen(delta) + varintLen(int64(i)) + bytesLen(m.Key) + bytesLen(m.Value) + varintLen(int64(len(m.Headers)))
		for j := range m.Headers {
			n += bytesLen(m.Headers[j].Key) + bytesLen(m.Headers[j].Value)
		}
		b = binary.AppendVarint(b, int64(n))
		b = append(b, 0) // attributes
		b = binary.AppendVarint(b, delta)
		b = binary.AppendVarint(b, int64(i))
		b = appendVarBytes(b, m.Key)
		b = appendVarBytes(b, m.Value)
		b = binary.AppendVarint(b, int64(len(m.Headers)))
		for j := range m.Headers {
			b = appendVarBytes(b, m.Headers[j].Key)
			b = appendVarBytes(b, m.Headers[j].Value)
		}
	}
	return b, maxDelta
}

// compress appends raw compressed with codec, as sarama's producer
// compresses (the same libraries and settings).
func (w *wire) compress(b []byte, codec sarama.CompressionCodec, level int, raw []byte) ([]byte, error) {
	switch codec {
	case sarama.CompressionZSTD:
		if w.zstd == nil {
			l := zstd.SpeedDefault
			if level != sarama.CompressionLevelDefault {
				l = zstd.EncoderLevelFromZstd(level)
			}
			var err error
			if w.zstd, err = zstd.NewWriter(nil, zstd.WithZeroFrames(true), zstd.WithEncoderLevel(l), zstd.WithEncoderConcurrency(1)); err != nil {
				return b, err
			}
		}
		return w.zstd.EncodeAll(raw, b), nil
	case sarama.CompressionSnappy:
		return append(b, snappy.Encode(nil, raw)...), nil
	}
	w.cbuf.Reset()
	var zw io.WriteCloser
	switch codec {
	case sarama.CompressionGZIP:
		if w.gz == nil {
			l := gzip.DefaultCompression
			if level != sarama.CompressionLevelDefault {
				l = level
			}
			var err error
			if w.gz, err = gzip.NewWriterLevel(&w.cbuf, l); err != nil {
				return b, err
			}
		}
		w.gz.Reset(&w.cbuf)
		zw = w.gz
	case sarama.CompressionLZ4:
		if w.lz == nil {
			w.lz = lz4.NewWriter(nil)
			if err := w.lz.Apply(lz4.BlockSizeOption(lz4.Block64Kb)); err != nil {
				return b, err
			}
		}
		w.lz.Reset(&w.cbuf)
		zw = w.lz
	default:
		return b, fmt.Errorf("compression codec %d: %w", codec, sarama.ErrUnsupportedVersion)
	}
	if _, err := zw.Write(raw); err != nil {
		return b, err
	}
	if err := zw.Close(); err != nil {
		return b, err
	}
	return append(b, w.cbuf.Bytes()...), nil
}

func varintLen(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}

// bytesLen is the encoded size of a varint-prefixed field (nil: -1).
func bytesLen(p []byte) int {
	if p == nil {
		return 1
	}
	return varintLen(int64(len(p))) + len(p)
}

func appendVarBytes(b, p []byte) []byte {
	if p == nil {
		return binary.AppendVarint(b, -1)
	}
	b = binary.AppendVarint(b, int64(len(p)))
	return append(b, p...)
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func appendBytes(b, p []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(p)))
	return append(b, p...)
}

// reader reads a response body; the first short read sets err and every
// later read returns zero values.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil || n < 0 || len(r.b) < n {
		if r.err == nil {
			r.err = sarama.ErrInsufficientData
		}
		return nil
	}
	p := r.b[:n]
	r.b = r.b[n:]
	return p
}

func (r *reader) skip(n int) { r.take(n) }

func (r *reader) int16() int16 {
	if p := r.take(2); p != nil {
		return int16(binary.BigEndian.Uint16(p))
	}
	return 0
}

func (r *reader) int32() int32 {
	if p := r.take(4); p != nil {
		return int32(binary.BigEndian.Uint32(p))
	}
	return 0
}

func (r *reader) int64() int64 {
	if p := r.take(8); p != nil {
		return int64(binary.BigEndian.Uint64(p))
	}
	return 0
}

// count reads an array length; a null array counts as empty.
func (r *reader) count() int {
	n := r.int32()
	if n < 0 || int(n) > len(r.b) {
		if n > 0 && r.err == nil {
			r.err = sarama.ErrInsufficientData
		}
		return 0
	}
	return int(n)
}

func (r *reader) stringBytes() []byte {
	n := r.int16()
	if n < 0 {
		return nil
	}
	return r.take(int(n))
}

func (r *reader) nullableString() string { return string(r.stringBytes()) }

func (r *reader) bytes() []byte {
	n := r.int32()
	if n < 0 {
		return nil
	}
	return r.take(int(n))
}
