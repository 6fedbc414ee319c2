"""`loadlens experiment`: guide procedures as data (trials of server configuration x load profile), run and analysed."""
