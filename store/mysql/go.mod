module github.com/idem-go/idem/store/mysql

go 1.25.0

toolchain go1.26.8

require github.com/idem-go/idem v0.0.0-00010101000000-000000000000

require github.com/go-sql-driver/mysql v1.10.1

require filippo.io/edwards25519 v1.2.0 // indirect

replace github.com/idem-go/idem => ../..
