package retention

import (
	"errors"
	"fmt"
	"time"
)

// Config is the retention part of the relay's configuration (keys under
// retention.).
type Config struct {
	// Keep is how long delivered rows stay in the outbox; 0 keeps them for
	// ever (the delivery horizon is still sampled).
	Keep time.Duration `yaml:"keep"`
	// Interval is how often the leader deletes (or drops) delivered rows
	// older than Keep.
	Interval time.Duration `yaml:"interval"`
	// BatchSize bounds the rows one DELETE transaction removes.
	BatchSize int `yaml:"batch_size"`
	// Archive moves rows to <table>_archive (partitioned by month) in the
	// transaction that deletes them, instead of only deleting them.
	Archive bool `yaml:"archive"`
}

// DefaultConfig returns the defaults documented in the README.
func DefaultConfig() Config {
	return Config{Keep: 168 * time.Hour, Interval: time.Minute, BatchSize: 1000}
}

// MaxBatchSize bounds retention.batch_size: one batch is one short
// transaction, its lock time and WAL proportional to its rows.
const MaxBatchSize = 100000

// Validate reports every invalid key by name, under prefix (e.g. "retention.").
func (c Config) Validate(prefix string) error {
	var errs []error
	if c.Keep < 0 {
		errs = append(errs, fmt.Errorf("%skeep: %s is negative: use a duration like 168h (7 days, the default), or 0 to keep rows for ever", prefix, c.Keep))
	}
	if c.Interval < time.Second || c.Interval > 24*time.Hour {
		errs = append(errs, fmt.Errorf("%sinterval: %s is out of range: use 1s..24h (default 1m)", prefix, c.Interval))
	}
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		errs = append(errs, fmt.Errorf("%sbatch_size: %d is out of range: use 1..%d (default 1000)", prefix, c.BatchSize, MaxBatchSize))
	}
	return errors.Join(errs...)
}

// Describe is the effective retention in words, for the start log.
func (c Config) Describe() string {
	if c.Keep == 0 {
		return "rows kept for ever (retention.keep 0): the delivery horizon is still sampled, nothing is deleted"
	}
	what := "deleted"
	if c.Archive {
		what = "moved to the archive table"
	}
	return fmt.Sprintf("delivered rows older than %s are %s every %s, in batches of %d rows", c.Keep, what, c.Interval, c.BatchSize)
}

// ShortKeep reports whether Keep is set but below an hour: rows vanish
// before anyone can debug or replay them.
func (c Config) ShortKeep() bool { return c.Keep > 0 && c.Keep < time.Hour }

// ShortKeepWarning is logged when ShortKeep.
const ShortKeepWarning = "retention.keep is under 1h: delivered rows are deleted before anyone can debug or replay them (seeds: keep 7-30 days for debugging and replay)"
