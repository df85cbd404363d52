package mysql

import (
	_ "embed"
	"fmt"
	"strings"
)

//go:embed queries.sql
var queriesFile string

// query is one statement of queries.sql, compiled to positional placeholders.
type query struct {
	name   string
	sql    string
	params []string // the parameter name of each ?, in order
}

// args holds a statement's named parameters.
type args map[string]any

// bind returns the positional arguments of q taken from a.
func (q *query) bind(a args) ([]any, error) {
	out := make([]any, len(q.params))
	for i, name := range q.params {
		v, ok := a[name]
		if !ok {
			return nil, fmt.Errorf("idem/mysql: query %s: no value for :%s", q.name, name)
		}
		out[i] = v
	}
	return out, nil
}

var queries = mustLoadQueries(queriesFile)

// q returns the named query; a missing name is a bug caught by any test.
func q(name string) *query {
	qq, ok := queries[name]
	if !ok {
		panic("idem/mysql: no query " + name)
	}
	return qq
}

var (
	qReserveUpsert  = q("reserve_upsert")
	qReserveSelect  = q("reserve_select")
	qTenantLock     = q("tenant_lock")
	qCountActive    = q("count_active")
	qRelease        = q("release")
	qMarkUnknown    = q("mark_unknown")
	qCheckpoint     = q("checkpoint")
	qExtend         = q("extend")
	qGet            = q("get")
	qState          = q("state")
	qDelete         = q("delete")
	qSweepSelect    = q("sweep_select")
	qSweepUpdate    = q("sweep_update")
	qListUnknownDue = q("list_unknown_due")
	qListUnknownAll = q("list_unknown_all")
	qDefer          = q("defer")
	qDeadLetter     = q("dead_letter")
	qMigrateLock    = q("migrate_lock")
	qMigrateUnlock  = q("migrate_unlock")
	qMigrateTable   = q("migrate_table")
	qMigrateApplied = q("migrate_applied")
	qMigrateRecord  = q("migrate_record")
	qProbeBatch     = q("probe_batch")
	qRollback       = q("rollback")

	// qReserveBatch sends Reserve's transaction as one multi-statement
	// query: one round trip instead of four. It is built from the two
	// queries above so that both paths run the same SQL; its parameters are
	// the upsert's followed by the select's.
	qReserveBatch = &query{
		name:   "reserve_batch",
		sql:    "START TRANSACTION; " + qReserveUpsert.sql + "; " + qReserveSelect.sql + "; COMMIT",
		params: append(append([]string(nil), qReserveUpsert.params...), qReserveSelect.params...),
	}
)

// The statements that share a piece of logic with another are composed
// here, each piece written once, in the form of queries.sql's blocks
// (:name parameters, {record_columns}); pending.go composes the queue's
// statements the same way.

// mustCompile compiles a statement written in Go, with {record_columns}.
func mustCompile(name, text string) *query {
	qq, err := compile(name, strings.ReplaceAll(text, "{record_columns}", q("record_columns").sql))
	if err != nil {
		panic(err)
	}
	return qq
}

// sqlNow is the statement's instant, as every statement reads it (see
// queries.sql).
const sqlNow = `COALESCE(CAST(:now AS DATETIME(6)), UTC_TIMESTAMP(6))`

// settling is what giving a record its outcome writes over it, whoever
// gives it (the lease holder, the reaper abandoning it, the settlement of an
// unknown one): the answer (NULLs for failed_retryable; see responseArgs),
// and no request kept for a worker, as that request may name the caller.
const settling = `queue = NULL,
    request = NULL,
    response_status = :status,
    response_headers = :headers,
    response_body = :body,
    response_body_omitted = :body_omitted`

// completing is the SET list that completes a record with an answer, in
// every statement that does (complete, reap_abandon); its arguments are the
// statement's own last_error and new expires_at.
func completing(lastError, expires string) string {
	return `state = 'completed',
    ` + settling + `,
    last_error = ` + lastError + `,
    completed_at = ` + sqlNow + `,
    updated_at = ` + sqlNow + `,
    expires_at = ` + expires
}

// renewedExpiry is the expiry a completion or a settlement gives a record:
// :ttl_us microseconds from now, or the record's own expiry when :ttl_us is
// not positive.
const renewedExpiry = `IF(:ttl_us > 0,
        DATE_ADD(` + sqlNow + `, INTERVAL :ttl_us MICROSECOND),
        expires_at)`

// reapDue picks up to :limit terminal records past expiry: reap_delete's
// and reap_soft's WHERE clause. No ORDER BY: any bounded batch will do, and
// ordering across two states would sort every candidate. DELETE ... LIMIT
// and UPDATE ... LIMIT are logged row-based (binlog format MIXED, the
// MariaDB default, or ROW, the MySQL default).
const reapDue = `
WHERE state IN ('completed', 'failed_retryable')
  AND expires_at <= ` + sqlNow + `
LIMIT :limit`

var (
	qComplete = mustCompile("complete", `
UPDATE idem_records SET
    `+completing("''", renewedExpiry)+`,
    row_version = row_version + 1
WHERE scope = :scope AND `+"`key`"+` = :key AND state = 'in_progress' AND fence = :fence`)

	// qResolve settles an unknown record. A settled outcome has no error;
	// a retryable one keeps why it left in_progress until a retry reclaims
	// it.
	qResolve = mustCompile("resolve", `
UPDATE idem_records SET
    state = :to,
    `+settling+`,
    completed_at = IF(:to = 'completed', `+sqlNow+`, NULL),
    last_error = IF(:to = 'completed', '', last_error),
    updated_at = `+sqlNow+`,
    expires_at = `+renewedExpiry+`,
    reconcile_after = NULL,
    dead_lettered_at = NULL,
    row_version = row_version + 1
WHERE scope = :scope AND `+"`key`"+` = :key AND state = 'unknown' AND fence = :fence`)

	qReapDelete = mustCompile("reap_delete", `DELETE FROM idem_records`+reapDue)

	// qTenantCheck is the tenant cap's check in the store's own READ
	// COMMITTED transaction, where each statement reads what committed
	// before it, so after the tenant's lock.
	qTenantCheck = tenantCheck("tenant_check", "")
	// qTenantCheckLocked is the check in a caller's transaction, whose
	// REPEATABLE READ snapshot may be older than the tenant's lock: a
	// plain read would miss the records made active since and the key's
	// latest state. A locking read reads the latest rows, and keeps them
	// as read until the transaction ends.
	qTenantCheckLocked = tenantCheck("tenant_check_locked", " LOCK IN SHARE MODE")

	qReapSoft = mustCompile("reap_soft", `
UPDATE idem_records SET
    state = 'expired',
    updated_at = `+sqlNow+`,
    row_version = row_version + 1`+reapDue)

	// qReapAbandon completes up to :limit unknown records past expiry, and
	// in_progress ones past expiry whose lease ended :grace_us ago too (a
	// holder that still renews its lease is alive, not abandoned), with
	// the abandoned answer.
	qReapAbandon = mustCompile("reap_abandon", `
UPDATE idem_records SET
    `+completing("'abandoned'", `DATE_ADD(`+sqlNow+`, INTERVAL :ttl_us MICROSECOND)`)+`,
    reconcile_after = NULL,
    dead_lettered_at = NULL,
    row_version = row_version + 1
WHERE state IN ('in_progress', 'unknown')
  AND expires_at <= `+sqlNow+`
  AND (state = 'unknown' OR locked_until <= DATE_SUB(`+sqlNow+`, INTERVAL :grace_us MICROSECOND))
LIMIT :limit`)
)

// tenantCheck counts the tenant's active records (store.State.Active),
// and tells whether the reservation would make one more active: the key
// is absent, or its record would be replaced (expired, or terminal past
// expires_at) or reclaimed (failed_retryable with the same fingerprint),
// as in reserve_upsert's decisions 1 and 2. lock ends both reads.
func tenantCheck(name, lock string) *query {
	return mustCompile(name, `
SELECT
    (SELECT COUNT(*) FROM idem_records
     WHERE tenant = :tenant AND state NOT IN ('completed', 'failed_retryable', 'expired')`+lock+`),
    COALESCE((SELECT state = 'expired'
        OR (state IN ('completed', 'failed_retryable') AND expires_at <= `+sqlNow+`)
        OR (state = 'failed_retryable' AND fingerprint = :fingerprint)
     FROM idem_records WHERE scope = :scope AND `+"`key`"+` = :key`+lock+`), TRUE)`)
}

func mustLoadQueries(src string) map[string]*query {
	m, err := loadQueries(src)
	if err != nil {
		panic(err)
	}
	return m
}

// loadQueries splits a queries file into "-- name: NAME" blocks, expands
// {record_columns} and compiles each block.
func loadQueries(src string) (map[string]*query, error) {
	raw := map[string]string{}
	var order []string
	var name string
	var body strings.Builder
	flush := func() {
		if name != "" {
			raw[name] = body.String()
			order = append(order, name)
		}
		body.Reset()
	}
	for line := range strings.Lines(src) {
		if n, ok := strings.CutPrefix(strings.TrimSpace(line), "-- name:"); ok {
			flush()
			name = strings.TrimSpace(n)
			if _, dup := raw[name]; dup {
				return nil, fmt.Errorf("idem/mysql: query %s defined twice", name)
			}
			continue
		}
		body.WriteString(line)
	}
	flush()

	cols, err := compile("record_columns", raw["record_columns"])
	if err != nil {
		return nil, err
	}
	out := map[string]*query{}
	for _, n := range order {
		text := strings.ReplaceAll(raw[n], "{record_columns}", cols.sql)
		qq, err := compile(n, text)
		if err != nil {
			return nil, err
		}
		out[n] = qq
	}
	return out, nil
}

// compile turns :name parameters into ? placeholders, drops comments,
// collapses whitespace and strips a trailing semicolon. Quoted strings and
// identifiers are copied untouched.
func compile(name, text string) (*query, error) {
	qq := &query{name: name}
	var b strings.Builder
	pendingSpace := false
	err := lexSQL(text, func(kind tokenKind, tok string) {
		if kind == tokSpace || kind == tokComment {
			pendingSpace = b.Len() > 0
			return
		}
		if pendingSpace {
			b.WriteByte(' ')
			pendingSpace = false
		}
		if kind == tokParam {
			b.WriteByte('?')
			qq.params = append(qq.params, tok[1:])
			return
		}
		b.WriteString(tok)
	})
	if err != nil {
		return nil, fmt.Errorf("idem/mysql: query %s: %w", name, err)
	}
	qq.sql = strings.TrimSpace(b.String())
	qq.sql = strings.TrimSpace(strings.TrimSuffix(qq.sql, ";"))
	if qq.sql == "" {
		return nil, fmt.Errorf("idem/mysql: query %s is empty", name)
	}
	return qq, nil
}

// splitStatements splits a migration file into statements at the semicolons
// that are outside quotes and comments. Comments are kept out of the result.
func splitStatements(text string) ([]string, error) {
	var out []string
	var b strings.Builder
	flush := func() {
		if s := strings.TrimSpace(b.String()); s != "" {
			out = append(out, s)
		}
		b.Reset()
	}
	err := lexSQL(text, func(kind tokenKind, tok string) {
		switch kind {
		case tokComment:
			b.WriteByte(' ')
		case tokSemicolon:
			flush()
		default:
			b.WriteString(tok)
		}
	})
	if err != nil {
		return nil, err
	}
	flush()
	return out, nil
}

type tokenKind int

const (
	tokText tokenKind = iota
	tokSpace
	tokComment
	tokQuoted
	tokParam
	tokSemicolon
)

// lexSQL cuts MySQL text into the pieces compile and splitStatements care
// about: quoted strings and identifiers ('...', "...", `...`), comments
// ("-- " and "#" to end of line, /* ... */), whitespace runs, :name
// parameters, semicolons, and everything else one byte at a time.
func lexSQL(text string, emit func(tokenKind, string)) error {
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case c == '\'' || c == '"' || c == '`':
			j := i + 1
			for ; j < len(text); j++ {
				if text[j] == '\\' && c != '`' {
					j++
					continue
				}
				if text[j] == c {
					if j+1 < len(text) && text[j+1] == c { // doubled quote
						j++
						continue
					}
					break
				}
			}
			if j >= len(text) {
				return fmt.Errorf("unterminated %c quote", c)
			}
			emit(tokQuoted, text[i:j+1])
			i = j + 1
		case c == '#' || (c == '-' && strings.HasPrefix(text[i:], "--") &&
			(i+2 == len(text) || text[i+2] == ' ' || text[i+2] == '\t' || text[i+2] == '\n')):
			j := strings.IndexByte(text[i:], '\n')
			if j < 0 {
				j = len(text) - i
			}
			emit(tokComment, text[i:i+j])
			i += j
		case c == '/' && strings.HasPrefix(text[i:], "/*"):
			j := strings.Index(text[i+2:], "*/")
			if j < 0 {
				return fmt.Errorf("unterminated comment")
			}
			emit(tokComment, text[i:i+2+j+2])
			i += 2 + j + 2
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			j := i
			for j < len(text) && (text[j] == ' ' || text[j] == '\t' || text[j] == '\n' || text[j] == '\r') {
				j++
			}
			emit(tokSpace, text[i:j])
			i = j
		case c == ':' && i+1 < len(text) && isIdentStart(text[i+1]):
			j := i + 1
			for j < len(text) && isIdent(text[j]) {
				j++
			}
			emit(tokParam, text[i:j])
			i = j
		case c == ';':
			emit(tokSemicolon, ";")
			i++
		default:
			emit(tokText, text[i:i+1])
			i++
		}
	}
	return nil
}

func isIdentStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdent(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') }
