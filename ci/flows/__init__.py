"""What runs the layers below end to end: the generated GitHub workflows, the skip plan, and the demo."""
