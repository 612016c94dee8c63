"""The production topology on one machine (issue 35): ``stack`` starts it, ``chaos`` breaks it."""
