// Package openapi embeds the router's generated OpenAPI v2 document so the
// router can serve it.
package openapi

import _ "embed"

// Document is the OpenAPI v2 (Swagger) JSON for RouterService's REST routes.
//
//go:embed baton.swagger.json
var Document []byte
