// Package listsql builds the SQL stores' List statement. Only the set
// filters become conditions, so each combination gets a plan that can use
// its index, and every value travels as a bind parameter.
package listsql

import (
	"strings"

	"github.com/idem-go/idem/store"
)

// Dialect spells the parts that differ between the SQL stores.
type Dialect struct {
	// Param is the placeholder of the n-th argument (1-based).
	Param func(n int) string
	// HasPrefix is the condition "scope starts with the value of param".
	HasPrefix func(param string) string
	// Key is the key column as the dialect must quote it.
	Key string
	// Order is the list order's columns, e.g. created_at, scope, key,
	// with whatever collation makes scope and key compare as bytes. It is
	// used in ORDER BY (each DESC) and in the keyset comparison.
	Order []string
	// Time turns a cursor's time into the argument the created_at column
	// compares with.
	Time func(c store.Cursor) any
}

// Build returns the statement selecting columns from table for p (already
// validated), Limit+1 rows for storekit.Page, and its arguments.
func Build(d Dialect, table, columns string, p store.ListParams) (string, []any) {
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return d.Param(len(args))
	}
	var where []string
	if p.ScopePrefix != "" {
		where = append(where, d.HasPrefix(arg(p.ScopePrefix)))
	}
	if p.Key != "" {
		where = append(where, d.Key+" = "+arg(p.Key))
	}
	if p.State != "" {
		where = append(where, "state = "+arg(string(p.State)))
	}
	if c := p.After; c != nil {
		where = append(where, "("+strings.Join(d.Order, ", ")+") < ("+
			arg(d.Time(*c))+", "+arg(c.Scope)+", "+arg(c.Key)+")")
	}
	var b strings.Builder
	b.WriteString("SELECT " + columns + " FROM " + table)
	if len(where) > 0 {
		b.WriteString(" WHERE " + strings.Join(where, " AND "))
	}
	b.WriteString(" ORDER BY " + strings.Join(d.Order, " DESC, ") + " DESC LIMIT " + arg(p.Limit+1))
	return b.String(), args
}
