package mysqllock

import (
	"context"
	"database/sql"
	"regexp"
	"sync"
)

// prepared runs one statement template either as a server-side prepared
// statement (the lease statements are long, and parsing them costs more
// than executing them) or, if the server or a proxy in between refuses to
// prepare it, as text with the values spliced in as literals.
type prepared struct {
	tmpl   string   // with {K}-style placeholders
	sql    string   // with ? placeholders
	params []string // placeholder names in the order of the ?s

	mu   sync.Mutex
	stmt *sql.Stmt
	text bool // preparing failed: send text
}

var placeholder = regexp.MustCompile(`\{[A-Z]+\}`)

func newPrepared(tmpl string) *prepared {
	p := &prepared{tmpl: tmpl}
	p.sql = placeholder.ReplaceAllStringFunc(tmpl, func(m string) string {
		p.params = append(p.params, m)
		return "?"
	})
	return p
}

// exec runs the statement with vals, which maps placeholder names to values
// and to their literal forms: vals[name] = {value, literal}.
func (p *prepared) exec(ctx context.Context, db *sql.DB, vals map[string][2]any) (sql.Result, error) {
	p.mu.Lock()
	if p.stmt == nil && !p.text {
		st, err := db.PrepareContext(ctx, p.sql)
		if err != nil && ctx.Err() == nil {
			p.text = true
		}
		p.stmt = st
	}
	st, text := p.stmt, p.text
	p.mu.Unlock()
	if st == nil || text {
		kv := make([]string, 0, 2*len(vals))
		for k, v := range vals {
			kv = append(kv, k, v[1].(string))
		}
		return db.ExecContext(ctx, fill(p.tmpl, kv...))
	}
	args := make([]any, len(p.params))
	for i, name := range p.params {
		args[i] = vals[name][0]
	}
	return st.ExecContext(ctx, args...)
}

func (p *prepared) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stmt != nil {
		_ = p.stmt.Close()
		p.stmt = nil
	}
}
