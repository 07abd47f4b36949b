package leader

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// FenceRights is what `outbox-relay check` reports about fencing: whether
// the connection's role may terminate the lease holder's backends, by the
// same rule a standby applies (canFence), and if not what to do.
type FenceRights struct {
	OK            bool
	Problem       string // empty when OK
	Role          string // current_user
	Super         bool
	SignalBackend bool   // has the privileges of pg_signal_backend
	HolderPID     int32  // the lease holder's backend; 0 when no instance leads
	HolderRole    string // its role
}

// CheckFence reads, on c, whether its role could fence the current lease
// holder of slot (or, with no holder, instances of its own role and, with
// pg_signal_backend, of any non-superuser role). One round trip; any
// goroutine owning c.
func CheckFence(ctx context.Context, c *pgx.Conn, slot string) (FenceRights, error) {
	p, err := readPrivileges(ctx, c, "outbox-relay:"+slot)
	if err != nil {
		return FenceRights{}, err
	}
	ok, problem := p.canFence()
	return FenceRights{OK: ok, Problem: problem, Role: p.Role, Super: p.Super, SignalBackend: p.SignalBackend,
		HolderPID: p.HolderPID, HolderRole: p.HolderRole}, nil
}
