"""Cost estimators: where the search's costs come from (table, farm, analytic bound, mock)."""
