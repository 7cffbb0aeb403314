from reasoner.cli import app

app(prog_name="reasoner")
