module github.com/idem-go/idem/contrib/chiidem

go 1.25.0

toolchain go1.26.8

require github.com/idem-go/idem v0.0.0-00010101000000-000000000000

require github.com/go-chi/chi/v5 v5.5.0

require (
	github.com/dunglas/httpsfv v1.1.2 // indirect
	github.com/gowebpki/jcs v1.0.2 // indirect
)

replace github.com/idem-go/idem => ../..
