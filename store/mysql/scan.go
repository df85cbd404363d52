package mysql

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/store"
)

const datetimeLayout = "2006-01-02 15:04:05.000000"

// nowArg is the :now parameter: nil selects the server's clock. The time is
// sent as UTC text rather than a time.Time because the driver would convert
// a time.Time to its connection's loc, which a *sql.DB given to New may not
// have set to UTC.
func (s *Store) nowArg() any {
	if s.clock == nil {
		return nil
	}
	return s.clock().UTC().Format(datetimeLayout)
}

// dbTime reads a DATETIME(6) holding UTC. With parseTime the driver returns
// a time.Time in its connection's loc: only the wall clock is meaningful, so
// it is reread as UTC. Without parseTime the driver returns the text.
type dbTime struct {
	t     time.Time
	valid bool
}

func (d *dbTime) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*d = dbTime{}
	case time.Time:
		d.t = time.Date(v.Year(), v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), time.UTC)
		d.valid = true
	case []byte:
		return d.parse(string(v))
	case string:
		return d.parse(v)
	default:
		return fmt.Errorf("idem/mysql: cannot read %T as a time", src)
	}
	return nil
}

func (d *dbTime) parse(s string) error {
	t, err := time.ParseInLocation("2006-01-02 15:04:05.999999", s, time.UTC)
	if err != nil {
		return fmt.Errorf("idem/mysql: %w", err)
	}
	d.t, d.valid = t, true
	return nil
}

type scanner interface{ Scan(dest ...any) error }

// scanRecord reads the columns of {record_columns}, preceded by lead and
// followed by trail.
func scanRecord(sc scanner, lead []any, trail ...any) (store.Record, error) {
	var (
		r                                            store.Record
		state, policy                                string
		lockedUntil, createdAt, updatedAt, expiresAt dbTime
		completedAt, reconcileAfter, deadLetteredAt  dbTime
		recoveryPoint, lastError                     []byte
		status                                       sql.NullInt32
		headers, body                                []byte
		omitted                                      bool
		owner                                        sql.NullInt64 // NULL on rows older than migration 011
	)
	dest := append(lead, &r.Scope, &r.Key, &r.Fingerprint, &state, &r.Fence, &policy, &lockedUntil,
		&recoveryPoint, &status, &headers, &body,
		&omitted, &lastError, &r.Attempts, &createdAt, &updatedAt,
		&completedAt, &expiresAt, &reconcileAfter, &r.ReconcileAttempts, &deadLetteredAt,
		&owner)
	dest = append(dest, trail...)
	if err := sc.Scan(dest...); err != nil {
		return store.Record{}, err
	}
	r.State = store.State(state)
	r.LeasePolicy = store.LeasePolicy(policy)
	r.RecoveryPoint = string(recoveryPoint)
	r.LastError = string(lastError)
	r.LockedUntil = lockedUntil.t
	r.CreatedAt = createdAt.t
	r.UpdatedAt = updatedAt.t
	r.CompletedAt = completedAt.t
	r.ExpiresAt = expiresAt.t
	r.ReconcileAfter = reconcileAfter.t
	r.DeadLetteredAt = deadLetteredAt.t
	r.Owner = owner.Int64
	if status.Valid {
		r.Response = &store.Response{Status: int(status.Int32), Body: body, BodyOmitted: omitted}
		if headers != nil {
			if err := json.Unmarshal(headers, &r.Response.Header); err != nil {
				return store.Record{}, fmt.Errorf("idem/mysql: response headers of %q: %w", r.Key, err)
			}
		}
	}
	return r, nil
}

// responseArgs adds a response's columns to a. Headers go as a JSON string,
// not []byte: the driver sends []byte as a binary string, which a MySQL JSON
// column refuses.
func responseArgs(a args, resp *store.Response) error {
	if resp == nil {
		a["status"], a["headers"], a["body"], a["body_omitted"] = nil, nil, nil, false
		return nil
	}
	a["status"] = resp.Status
	a["headers"] = nil
	if resp.Header != nil {
		h, err := json.Marshal(resp.Header)
		if err != nil {
			return fmt.Errorf("idem/mysql: response headers: %w", err)
		}
		a["headers"] = string(h)
	}
	// A nil body is stored as NULL and an empty one as '', so both read back
	// as they were given.
	a["body"] = resp.Body
	if resp.Body == nil || resp.BodyOmitted {
		a["body"] = nil
	}
	a["body_omitted"] = resp.BodyOmitted
	return nil
}

// collect reads every row with scan and closes rows.
func collect(rows *sql.Rows, scan func(scanner) (store.Record, error)) ([]store.Record, error) {
	var out []store.Record
	for rows.Next() {
		rec, err := scan(rows)
		if err != nil {
			_ = rows.Close()
			return nil, err
		}
		out = append(out, rec)
	}
	return out, errors.Join(rows.Err(), rows.Close())
}

// scanPlain is scanRecord with no columns around the record's.
func scanPlain(sc scanner) (store.Record, error) { return scanRecord(sc, nil) }
