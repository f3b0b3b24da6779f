"""One module per resource. Routers are included by api.app in an order that matters: model
names may contain a slash (hub ids), so the bare `/v1/models/{name}` route comes last."""
