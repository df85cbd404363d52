module github.com/idem-go/idem/contrib/echoidem

go 1.25.0

toolchain go1.26.8

require github.com/idem-go/idem v0.0.0-00010101000000-000000000000

require github.com/labstack/echo/v5 v5.4.4

require (
	github.com/dunglas/httpsfv v1.1.2 // indirect
	github.com/gowebpki/jcs v1.0.2 // indirect
	golang.org/x/time v0.15.0 // indirect
)

replace github.com/idem-go/idem => ../..
