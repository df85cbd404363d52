module github.com/idem-go/idem/store/postgres

go 1.25.0

toolchain go1.26.8

require github.com/idem-go/idem v0.0.0-00010101000000-000000000000

require (
	github.com/jackc/pgx/v5 v5.12.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/dunglas/httpsfv v1.1.2 // indirect
	github.com/gowebpki/jcs v1.0.2 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

replace github.com/idem-go/idem => ../..
